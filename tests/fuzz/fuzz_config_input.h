/*
 * fuzz_config_input - the input format of fuzz_config, shared with the corpus generator:
 *
 *   byte 0           flags: FUZZ_CONFIG_OPTIONS (options follow), FUZZ_CONFIG_KEEP_VERSION (use
 *                    the options' version field as given; otherwise it is set to the known one)
 *   [options]        sizeof(cfx_init_options) bytes, the struct as in memory (when flagged)
 *   NAME=VALUE\n...  the CFX_* variables that are set (the first line naming a variable wins)
 */
#ifndef CFX_FUZZ_CONFIG_INPUT_H
#define CFX_FUZZ_CONFIG_INPUT_H

#define FUZZ_CONFIG_OPTIONS 1
#define FUZZ_CONFIG_KEEP_VERSION 2

#endif /* CFX_FUZZ_CONFIG_INPUT_H */
