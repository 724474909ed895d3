/*
 * slurm-burst lab: preloaded (LD_PRELOAD) into the lab's slurmctld, and nothing else.
 *
 * burst_buffer/lua's pre_run thread waits for a job's nodes to boot in steps of
 * sleep(60), hard-coded in burst_buffer_lua.c from 22.05 to 26.05: a staging job whose
 * cloud node joins in seconds starts up to a minute later. No slurm.conf setting changes
 * it. In the lab, where every staging test waits on it, a sleep of exactly 60 s becomes
 * SLURM_BURST_LAB_PRE_RUN_POLL seconds (the [lab] section's pre_run_poll, 1 to 59);
 * every other sleep is Slurm's own. Within slurmctld and the plugins the lab loads, the
 * only other sleep() that can last 60 s is burst_buffer/lua's teardown retry, which then
 * retries sooner.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

#define SLURM_PRE_RUN_POLL 60

static unsigned int (*real_sleep)(unsigned int);
static unsigned int poll_seconds = SLURM_PRE_RUN_POLL;

__attribute__((constructor)) static void prerunpoll_init(void)
{
	const char *text = getenv("SLURM_BURST_LAB_PRE_RUN_POLL");
	char *end = NULL;
	unsigned long value;

	real_sleep = (unsigned int (*)(unsigned int))dlsym(RTLD_NEXT, "sleep");
	if (!text || !*text)
		return;
	value = strtoul(text, &end, 10);
	if (!*end && value >= 1 && value < SLURM_PRE_RUN_POLL)
		poll_seconds = (unsigned int)value;
}

unsigned int sleep(unsigned int seconds)
{
	if (seconds == SLURM_PRE_RUN_POLL)
		seconds = poll_seconds;
	return real_sleep(seconds);
}
