/* cache.c -- (being written) */
