/*
 * mpswrap_spank.c -- a SPANK plugin that adds --mps[=POLICY] to sbatch, salloc and srun.
 *
 * A job submitted with --mps opts in to mpswrap's prolog (prolog_mode = opt-in, trigger
 * "spank"), as gres/mps, a feature or a comment does. POLICY sets every task's share of
 * the GPU's threads, as `mpswrap run --threads` does: none, uniform (100/N), oversubscribe
 * (min(100, 200/N)), a percent (1-100), or weights w1:w2:...; plain --mps keeps the admin's
 * defaults. A bad POLICY is refused at submission, with one line.
 *
 * The plugin only carries the request: in the submitting command (local and allocator
 * contexts) it sets the job control variable MPSWRAP_MPS, which slurmd hands to the prolog
 * and epilog as SPANK_MPSWRAP_MPS. Everything else is the prolog's.
 *
 * Build on each node (login nodes too: sbatch loads it) against the installed Slurm's
 * headers (Debian: libslurm-dev; RHEL: slurm-devel), e.g. with
 * `mpswrap install-hooks --spank ...`, or by hand:
 *     cc -shared -fPIC -O2 -Wall -I/usr/include -o mpswrap_spank.so mpswrap_spank.c
 * and enable it in plugstack.conf:
 *     optional /usr/local/libexec/mpswrap/mpswrap_spank.so
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/spank.h>

SPANK_PLUGIN(mpswrap, 1);

#define POLICY_MAX 64

static char policy[POLICY_MAX] = "";
static int asked = 0;

/* A positive decimal number: digits with at most one '.', not empty. */
static int positive_number(const char *s, size_t n, double *value)
{
    char buf[POLICY_MAX];
    size_t dots = 0, digits = 0;
    char *end;

    if (n == 0 || n >= sizeof(buf))
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '.')
            dots++;
        else if (isdigit((unsigned char)s[i]))
            digits++;
        else
            return 0;
    }
    if (dots > 1 || digits == 0)
        return 0;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *value = strtod(buf, &end);
    return *end == '\0' && *value > 0;
}

/* none | uniform | oversubscribe | a percent in (0, 100] | w1:w2:... (each > 0) */
static int valid_policy(const char *p)
{
    const char *part = p;
    double value = 0;
    int parts = 0;

    if (strlen(p) >= POLICY_MAX)
        return 0;
    if (!strcmp(p, "none") || !strcmp(p, "uniform") || !strcmp(p, "oversubscribe"))
        return 1;
    for (;;) {
        const char *colon = strchr(part, ':');
        size_t n = colon ? (size_t)(colon - part) : strlen(part);
        if (!positive_number(part, n, &value))
            return 0;
        parts++;
        if (!colon)
            break;
        part = colon + 1;
    }
    return parts > 1 || value <= 100;
}

static int opt_mps(int val, const char *optarg, int remote)
{
    (void)val;
    /* A plain --mps comes back without its value in a job's steps: an srun inside an
     * sbatch --mps job gets the option again from the job's environment
     * (SLURM_SPANK__SLURM_SPANK_OPTION_mpswrap_mps) as "(null)", and slurmstepd hands the
     * batch step (remote) the value sbatch stored for it, "". Only a submitting command
     * (local, allocator) reads what the user typed: there "--mps=" is refused. */
    if (optarg && (!strcmp(optarg, "(null)") || (remote && !*optarg)))
        optarg = NULL;
    if (optarg && !valid_policy(optarg)) {
        slurm_error("mpswrap: bad --mps policy '%s': use none, uniform, oversubscribe, "
                    "a percent (1-100) or weights w1:w2:...", optarg);
        return -1;
    }
    strcpy(policy, optarg ? optarg : "default");
    asked = 1;
    return 0;
}

static struct spank_option mps_option = {
    "mps",
    "[policy]",
    "Run this job's GPU processes side by side through NVIDIA MPS (mpswrap). Optional policy "
    "for each task's share of the GPU: none, uniform, oversubscribe, a percent or w1:w2:...",
    2, /* the argument is optional */
    0,
    (spank_opt_cb_f)opt_mps,
};

/* Registered here rather than through a static spank_options table: sbatch and salloc
 * (allocator context) see options registered this way. */
int slurm_spank_init(spank_t sp, int ac, char **av)
{
    (void)ac;
    (void)av;
    if (spank_option_register(sp, &mps_option) != ESPANK_SUCCESS) {
        slurm_error("mpswrap: cannot register --mps");
        return -1;
    }
    return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    spank_context_t ctx = spank_context();

    (void)ac;
    (void)av;
    if (!asked || (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR))
        return 0;
    if (spank_job_control_setenv(sp, "MPSWRAP_MPS", policy, 1) != ESPANK_SUCCESS) {
        slurm_error("mpswrap: cannot pass --mps to the job");
        return -1;
    }
    return 0;
}
