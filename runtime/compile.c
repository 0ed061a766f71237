/* compile.c -- (being written) */
