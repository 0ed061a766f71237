/* module.c -- (being written) */
