/* bench/handler_ok.c - the trivial handler of the `idem run` benchmark.
 *
 * Answers {"ok":true} to every envelope. It is also the model of a fast
 * handler in any language: read whatever input is there, answer every
 * complete line, and write the answers out before blocking for more
 * input. Answering per line with a flush costs a write(2) per message;
 * waiting for a full buffer before answering deadlocks (idem sends a
 * batch, then waits for its answers). */
#include <string.h>
#include <unistd.h>

int main(void)
{
    static char in[1 << 16], out[1 << 16];
    static const char ok[] = "{\"ok\":true}\n";
    size_t keep = 0;
    ssize_t n;
    while ((n = read(0, in + keep, sizeof in - keep)) > 0) {
        size_t len = keep + (size_t)n, start = 0, o = 0;
        char *nl;
        while ((nl = memchr(in + start, '\n', len - start))) {
            if (o + sizeof ok > sizeof out) {
                if (write(1, out, o) != (ssize_t)o)
                    return 1;
                o = 0;
            }
            memcpy(out + o, ok, sizeof ok - 1);
            o += sizeof ok - 1;
            start = (size_t)(nl - in) + 1;
        }
        if (o && write(1, out, o) != (ssize_t)o)
            return 1;
        keep = len - start;
        if (keep == sizeof in)
            keep = 0;  /* a line longer than the buffer: its tail answers */
        memmove(in, in + start, keep);
    }
    return 0;
}
