/*
 * launch_env - what the launcher's environment says about the job: which launcher started this
 * process (explicit CFX_* variables, Open MPI's mpirun, torchrun, Slurm's srun, Horovod's Gloo
 * launcher), this process's rank and the world's size, and where the ranks meet (a TCP store's
 * host:port, or a file store's directory).
 *
 * Sources are tried in a fixed order: CFX_RANK/CFX_SIZE, then Open MPI, then torchrun, then Slurm,
 * then Horovod. CFX_RENDEZVOUS_ADDR / CFX_RENDEZVOUS_DIR / CFX_RENDEZVOUS_PORT override the place of
 * the meeting for every source. Reading only: nothing here joins anything (engine/world.c does).
 */
#ifndef CFX_LAUNCH_ENV_H
#define CFX_LAUNCH_ENV_H

#include "conflux/conflux.h"

typedef enum cx_launcher {
    CX_LAUNCHER_NONE = 0,     /* nothing seen: a process of its own */
    CX_LAUNCHER_CFX = 1,      /* CFX_RANK / CFX_SIZE (cfxrun --transport gloo, or by hand) */
    CX_LAUNCHER_OPENMPI = 2,  /* OMPI_COMM_WORLD_* (mpirun, or cfxrun over mpirun) */
    CX_LAUNCHER_TORCHRUN = 3, /* RANK / WORLD_SIZE / MASTER_ADDR (torchrun, PyTorchJob) */
    CX_LAUNCHER_SLURM = 4,    /* SLURM_PROCID / SLURM_NTASKS (srun) */
    CX_LAUNCHER_HOROVOD = 5   /* HOROVOD_RANK / HOROVOD_SIZE (horovodrun --gloo) */
} cx_launcher;

#define CX_LAUNCH_HOST_MAX 256
#define CX_LAUNCH_DIR_MAX 1024

typedef struct cx_launch {
    cx_launcher launcher;
    int mpi_launch;             /* OMPI_COMM_WORLD_SIZE is set: mpirun started this process */
    int rank, size;             /* -1 when the launcher does not say */
    int local_rank, local_size; /* -1 when the launcher does not say */
    int elastic;                /* CFX_ELASTIC=1 (cfxrun --elastic): cfx_init joins elastically */
    int elastic_id;             /* CFX_ELASTIC_ID (cfxrun --elastic): the member id; -1 unset */
    /* Where the ranks meet: a TCP store at store_host:store_port, or a file store in store_dir, or
     * neither (store_port 0 and store_dir ""; then `missing` says what is lacking). */
    char store_host[CX_LAUNCH_HOST_MAX];
    int store_port;
    /* A port derived from the launcher's variables may be taken by another program's socket:
     * the store then takes the first free one of store_port .. store_port + store_port_span - 1,
     * and ranks know it by store_token (one per job and attempt). Span 1 and no token for a port
     * the user chose. */
    int store_port_span;
    char store_token[256];
    char store_dir[CX_LAUNCH_DIR_MAX];
    /* CFX_RENDEZVOUS_SCOPE (set by a launcher that forms worlds of the same processes again and
     * again, as conflux.ray's executors do for each run): the worlds joined under one scope meet
     * in its own key space, counted from 1 there, so a process that joined a world its peers did
     * not (a late task of a failed run) is not one world ahead of them ever after. "" = unset. */
    char store_scope[64];
    /* Rank 0 serves the TCP store unless a launcher does (CFX_RENDEZVOUS_EXTERNAL=1: cfxrun). */
    int store_served_by_launcher;
    /* Which variables gave the meeting place, for the log and for error messages. */
    char store_source[160];
    /* Empty when the world can be joined from what was read; otherwise what is lacking. */
    char missing[512];
} cx_launch;

/* The launcher's name as a user knows it ("torchrun", "Slurm (srun)", ...). */
const char *cx_launcher_name(cx_launcher l);

/* The command that starts it ("mpirun", "torchrun", ...). */
const char *cx_launcher_command(cx_launcher l);

/* Reads the launch variables through `lookup` (NULL or "" = unset; NULL lookup = getenv).
 * CFX_ERR_CONFIG naming the variable and its text when one is malformed (a rank that is not a
 * number, a rank outside the size, a port outside 1..65535). */
typedef const char *(*cx_launch_lookup)(const char *name, void *user);
cfx_status cx_launch_detect(cx_launch *out, cx_launch_lookup lookup, void *user);

/* The deadline of a rendezvous (CFX_RENDEZVOUS_TIMEOUT_S, default 60 s) and of a transport wait
 * (CFX_TRANSPORT_TIMEOUT_S, default 30 s), in seconds; CFX_ERR_CONFIG when malformed. */
cfx_status cx_launch_timeouts(cx_launch_lookup lookup, void *user, double *rendezvous_s,
                              double *transport_s);

/* The defaults of a membership round (cfx_reform_options_init), set by cfxrun --elastic:
 * CFX_ELASTIC_MIN_SIZE (1), CFX_ELASTIC_MAX_SIZE (0: no maximum), CFX_ELASTIC_TIMEOUT_S (60) and
 * CFX_ELASTIC_SETTLE_S (10); a malformed value is CFX_ERR_CONFIG naming it. */
typedef struct cx_elastic_defaults {
    int min_size, max_size;
    double timeout_s, settle_s;
} cx_elastic_defaults;
cfx_status cx_launch_elastic_defaults(cx_launch_lookup lookup, void *user, cx_elastic_defaults *out);

#endif /* CFX_LAUNCH_ENV_H */
