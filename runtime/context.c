/* context.c -- (being written) */
