/* An outside program built against an installed Conflux (find_package or pkg-config): it checks
 * that the installed header and the installed library agree. */
#include <conflux/conflux.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
    char expect[64];
    snprintf(expect, sizeof expect, "%d.%d.%d", CFX_VERSION_MAJOR, CFX_VERSION_MINOR,
             CFX_VERSION_PATCH);
    printf("consumer: header %d, cfx_version() %d, cfx_version_string() %s\n", CFX_VERSION_NUMBER,
           cfx_version(), cfx_version_string());
    if (cfx_version() != CFX_VERSION_NUMBER || strcmp(cfx_version_string(), expect) != 0) {
        fprintf(stderr, "consumer: the installed library does not match the installed header\n");
        return 1;
    }
    return 0;
}
