/*
 * replay_main - runs a fuzz target over saved inputs without libFuzzer, so every build (gcc, the
 * ASan and TSan stages) replays the corpus and its regression inputs: replay DIR|FILE...
 * Directories are read in name order. A failing property aborts (fuzz_check.h), naming the input
 * on stderr first; at the end the number of inputs is printed, and zero inputs is a failure.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 4096;
            uint8_t *grown = realloc(buf, cap);
            if (!grown) {
                fprintf(stderr, "replay: out of memory reading %s\n", path);
                free(buf);
                fclose(f);
                return -1;
            }
            buf = grown;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    fclose(f);
    /* An exact-size copy, so ASan sees a read one byte past the input. */
    uint8_t *exact = malloc(len ? len : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    if (len)
        memcpy(exact, buf, len);
    free(buf);
    fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    return 1;
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int run_dir(const char *dir)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, by_name), count = 0;
    if (n < 0) {
        fprintf(stderr, "replay: cannot read directory %s\n", dir);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]->d_name);
        if (names[i]->d_name[0] != '.' && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            int r = run_file(path);
            if (r < 0)
                count = -1;
            else if (count >= 0)
                count += r;
        }
        free(names[i]);
    }
    free(names);
    return count;
}

int main(int argc, char **argv)
{
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        int n = stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode) ? run_dir(argv[i]) : run_file(argv[i]);
        if (n < 0)
            return 1;
        total += n;
    }
    printf("replay: %d inputs, every property held\n", total);
    return total > 0 ? 0 : 1;
}
