/* test_errors.c - the error table: every code has its text, the values
 * are the ABI's, and a value outside the table is named unknown.
 *
 * The values are written out here on purpose, apart from IDEM_ERRNO_MAP:
 * a program compiled against an older header holds them as literals, so
 * an edit of the table that renumbers a code must fail a test. */
#include <criterion/criterion.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "idem/idem.h"

#define UNKNOWN "IDEM_E?: unknown error code"

TestSuite(errors, .timeout = 60);

Test(errors, every_code_in_the_table_has_its_text)
{
    size_t n = 0;
#define CHECK_TEXT(name, value, text)                                      \
    do {                                                                   \
        const char *want = "IDEM_" #name ": " text;                        \
        cr_assert_str_eq(idem_strerror(value), want);                      \
        cr_assert_neq(strlen(text), 0, "%s has no text", #name);           \
        n++;                                                               \
    } while (0);
    IDEM_ERRNO_MAP(CHECK_TEXT)
#undef CHECK_TEXT
    cr_assert_eq(n, 20, "codes in IDEM_ERRNO_MAP: %zu", n);
}

Test(errors, values_never_change)
{
    static const struct {
        int code, abi;
    } pinned[] = {
        {IDEM_OK, 0},           {IDEM_EINVAL, -1},      {IDEM_ENOMEM, -2},
        {IDEM_EIO, -3},         {IDEM_ENOSPC, -4},      {IDEM_ENOTFOUND, -5},
        {IDEM_ELOST, -6},       {IDEM_ELOCKED, -7},     {IDEM_ECORRUPT, -8},
        {IDEM_EKEYSIZE, -9},    {IDEM_EVALSIZE, -10},   {IDEM_EVERSION, -11},
        {IDEM_ECOLLISION, -12}, {IDEM_ECONN, -13},      {IDEM_ETIMEOUT, -14},
        {IDEM_EPROTO, -15},     {IDEM_EAUTH, -16},      {IDEM_ENOTSUP, -17},
        {IDEM_ESTOPPED, -18},   {IDEM_ECLOCK, -32},
    };
    for (size_t i = 0; i < sizeof pinned / sizeof pinned[0]; i++)
        cr_assert_eq(pinned[i].code, pinned[i].abi, "entry %zu", i);
}

Test(errors, a_value_outside_the_table_is_unknown)
{
    static const int outside[] = {1, -19, -31, -33, INT_MIN, INT_MAX};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++)
        cr_assert_str_eq(idem_strerror(outside[i]), UNKNOWN, "%d",
                         outside[i]);
}
