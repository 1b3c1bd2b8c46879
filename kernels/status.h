// status.h: the failure text behind slime_last_error(), one per library
// and thread. Internal to the .cu sources; not part of the ABI.
#ifndef SLIME_STATUS_H
#define SLIME_STATUS_H

#include <stdarg.h>
#include <stdio.h>

static __thread char last_error[512];

// fail records the text of a failure and returns its status code.
static int fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

#endif
