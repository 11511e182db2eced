/* --plot: a PNG timeline of a simulated refit, drawn and encoded here (no
 * plotting library on the machines this runs on).
 *
 * Top: one bar per receiver, grey while it discovers and picks holders,
 * then blue (bytes from trainer ranks) or orange (from relays) while it
 * transfers.  Bottom: the utilisation over time of the busiest links.
 * Encoding: PNG rows filtered (None, Sub or Up, whichever sums smallest),
 * then deflate with the fixed Huffman code and runs of repeated bytes as
 * distance-1 matches; zlib and PNG checksums. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "util/util.h"

/* ---- encoding ------------------------------------------------------------- */

typedef struct {
    uint8_t *buf;
    size_t len, cap;
    uint64_t bits;
    int nbits;
    bool oom;
} bw_t;

static void byte_out(bw_t *w, uint8_t b)
{
    if (w->len == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 65536;
        uint8_t *nb = realloc(w->buf, cap);
        if (!nb) {
            w->oom = true;
            return;
        }
        w->buf = nb;
        w->cap = cap;
    }
    w->buf[w->len++] = b;
}

static void put_bits(bw_t *w, uint32_t v, int n)
{
    w->bits |= (uint64_t)v << w->nbits;
    w->nbits += n;
    while (w->nbits >= 8) {
        byte_out(w, (uint8_t)w->bits);
        w->bits >>= 8;
        w->nbits -= 8;
    }
}

/* Huffman codes go most significant bit first. */
static void put_code(bw_t *w, uint32_t code, int n)
{
    uint32_t r = 0;
    for (int i = 0; i < n; i++) r |= ((code >> i) & 1u) << (n - 1 - i);
    put_bits(w, r, n);
}

static void put_sym(bw_t *w, unsigned sym)
{
    if (sym < 144) put_code(w, 0x30 + sym, 8);
    else if (sym < 256) put_code(w, 0x190 + (sym - 144), 9);
    else if (sym < 280) put_code(w, sym - 256, 7);
    else put_code(w, 0xc0 + (sym - 280), 8);
}

static const uint16_t g_len_base[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                        31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t g_len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                        2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};

static void put_run(bw_t *w, unsigned len) /* a match of len (3..258) at distance 1 */
{
    int k = 28;
    while (g_len_base[k] > len) k--;
    put_sym(w, 257 + (unsigned)k);
    if (g_len_extra[k]) put_bits(w, len - g_len_base[k], g_len_extra[k]);
    put_code(w, 0, 5); /* distance code 0: distance 1 */
}

static uint32_t adler32(const uint8_t *p, size_t n)
{
    uint32_t a = 1, b = 0;
    for (size_t i = 0; i < n; i++) {
        a = (a + p[i]) % 65521;
        b = (b + a) % 65521;
    }
    return (b << 16) | a;
}

static uint32_t crc32_png(uint32_t crc, const uint8_t *p, size_t n)
{
    static uint32_t table[256];
    static bool ready;
    if (!ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
            table[i] = c;
        }
        ready = true;
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}

static bool chunk(FILE *f, const char *type, const uint8_t *data, uint32_t n)
{
    uint8_t hdr[8];
    be32(hdr, n);
    memcpy(hdr + 4, type, 4);
    uint32_t crc = crc32_png(0, hdr + 4, 4);
    crc = crc32_png(crc, data, n);
    uint8_t tail[4];
    be32(tail, crc);
    return fwrite(hdr, 1, 8, f) == 8 && (n == 0 || fwrite(data, 1, n, f) == n) && fwrite(tail, 1, 4, f) == 4;
}

refit_status_t sim_png_write(const char *path, const uint8_t *rgb, uint32_t w, uint32_t h)
{
    size_t stride = (size_t)w * 3, rawn = (stride + 1) * h;
    uint8_t *raw = malloc(rawn), *cand = malloc(stride * 3);
    if (!raw || !cand) {
        free(raw);
        free(cand);
        return refit_error(REFIT_ERR_NO_MEMORY, "png");
    }
    for (uint32_t y = 0; y < h; y++) {
        const uint8_t *row = rgb + y * stride, *up = y ? rgb + (y - 1) * stride : NULL;
        uint64_t best = UINT64_MAX;
        int pick = 0;
        for (int t = 0; t < 3; t++) {
            uint8_t *o = cand + t * stride;
            uint64_t sum = 0;
            for (size_t i = 0; i < stride; i++) {
                uint8_t pred = t == 1 ? (i >= 3 ? row[i - 3] : 0) : t == 2 ? (up ? up[i] : 0) : 0;
                o[i] = (uint8_t)(row[i] - pred);
                sum += o[i] < 128 ? o[i] : 256 - o[i];
            }
            if (sum < best) best = sum, pick = t;
        }
        uint8_t *dst = raw + y * (stride + 1);
        dst[0] = (uint8_t)pick; /* 0 None, 1 Sub, 2 Up */
        memcpy(dst + 1, cand + pick * stride, stride);
    }
    free(cand);
    bw_t z = {0};
    byte_out(&z, 0x78);
    byte_out(&z, 0x01);
    put_bits(&z, 1, 1); /* the last block */
    put_bits(&z, 1, 2); /* fixed Huffman codes */
    for (size_t i = 0; i < rawn;) {
        size_t run = 0;
        if (i > 0)
            while (i + run < rawn && raw[i + run] == raw[i - 1] && run < 258) run++;
        if (run >= 3) {
            put_run(&z, (unsigned)run);
            i += run;
        } else {
            put_sym(&z, raw[i]);
            i++;
        }
    }
    put_sym(&z, 256);
    if (z.nbits) put_bits(&z, 0, 8 - z.nbits);
    uint8_t ad[4];
    be32(ad, adler32(raw, rawn));
    for (int k = 0; k < 4; k++) byte_out(&z, ad[k]);
    free(raw);
    if (z.oom) {
        free(z.buf);
        return refit_error(REFIT_ERR_NO_MEMORY, "png");
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(z.buf);
        return refit_error(REFIT_ERR_IO, "cannot write %s", path);
    }
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    uint8_t ihdr[13];
    be32(ihdr, w);
    be32(ihdr + 4, h);
    ihdr[8] = 8;  /* bit depth */
    ihdr[9] = 2;  /* RGB */
    ihdr[10] = 0; /* deflate */
    ihdr[11] = 0; /* adaptive filters */
    ihdr[12] = 0; /* no interlace */
    bool ok = fwrite(sig, 1, 8, f) == 8 && chunk(f, "IHDR", ihdr, 13) && chunk(f, "IDAT", z.buf, (uint32_t)z.len) &&
              chunk(f, "IEND", NULL, 0);
    free(z.buf);
    if (fclose(f) != 0) ok = false;
    return ok ? REFIT_OK : refit_error(REFIT_ERR_IO, "writing %s", path);
}

/* ---- drawing ---------------------------------------------------------------- */

typedef struct {
    uint8_t *px;
    uint32_t w, h;
} canvas_t;

static void dot(canvas_t *c, int x, int y, uint32_t rgb)
{
    if (x < 0 || y < 0 || (uint32_t)x >= c->w || (uint32_t)y >= c->h) return;
    uint8_t *p = c->px + ((size_t)y * c->w + (size_t)x) * 3;
    p[0] = (uint8_t)(rgb >> 16), p[1] = (uint8_t)(rgb >> 8), p[2] = (uint8_t)rgb;
}

static void rect(canvas_t *c, int x0, int y0, int x1, int y1, uint32_t rgb)
{
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) dot(c, x, y, rgb);
}

/* 5x7 glyphs: rows top down, bit 4 the leftmost column. */
static const struct {
    char ch;
    uint8_t rows[7];
} g_font[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'>', {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}}, {'<', {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}}, {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}}, {' ', {0, 0, 0, 0, 0, 0, 0}},
};

static void text(canvas_t *c, int x, int y, const char *s, uint32_t rgb)
{
    for (; *s; s++, x += 6) {
        char ch = *s >= 'a' && *s <= 'z' ? (char)(*s - 'a' + 'A') : *s;
        const uint8_t *rows = NULL;
        for (size_t i = 0; i < sizeof(g_font) / sizeof(g_font[0]); i++)
            if (g_font[i].ch == ch) rows = g_font[i].rows;
        for (int r = 0; r < 7; r++)
            for (int col = 0; col < 5; col++)
                if (rows ? rows[r] & (0x10 >> col) : (r == 0 || r == 6 || col == 0 || col == 4))
                    dot(c, x + col, y + r, rgb);
    }
}

static const uint32_t g_colors[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd, 0x8c564b};

refit_status_t sim_plot_png(const char *path, const sim_fleet_t *f, const sim_cluster_t *cl, const sim_result_t *r)
{
    const uint32_t W = 1000, left = 70, right = 20, top = 40, rowh_max = 12;
    uint32_t n = r->receivers;
    uint32_t rowh = n ? REFIT_MIN(rowh_max, REFIT_MAX(2u, 360 / n)) : 4;
    uint32_t bars_h = rowh * n, gap = 40, plot_h = 180, H = top + bars_h + gap + plot_h + 70;
    canvas_t c = {calloc((size_t)W * H * 3, 1), W, H};
    if (!c.px) return refit_error(REFIT_ERR_NO_MEMORY, "plot");
    memset(c.px, 0xff, (size_t)W * H * 3);
    double T = r->refit_s > 0 ? r->refit_s : 1, t0 = INFINITY;
    for (uint32_t i = 0; i < n; i++) t0 = fmin(t0, r->rx[i].begin);
    if (!isfinite(t0)) t0 = 0;
    double pw = W - left - right;
#define XOF(t) ((int)(left + ((t)-t0) / T * pw))
    char buf[256];
    snprintf(buf, sizeof(buf), "%s %s -> %s x%u, relays %s: predicted %.3f s", f->model, f->src, f->dst, f->replicas,
             f->relays ? "on" : "off", r->refit_s);
    text(&c, 10, 8, buf, 0x000000);
    snprintf(buf, sizeof(buf),
             "cluster %s. bars: receivers (grey: discover and pick, blue: from trainer, orange: from relays)",
             cl->name);
    text(&c, 10, 22, buf, 0x444444);
    for (uint32_t i = 0; i < n; i++) {
        const sim_rx_result_t *x = &r->rx[i];
        int y = (int)(top + i * rowh);
        uint32_t col = x->bytes_relay > x->bytes_trainer ? 0xff7f0e : 0x1f77b4;
        rect(&c, XOF(x->begin), y, REFIT_MAX(XOF(x->xfer), XOF(x->begin) + 1), y + (int)rowh - (rowh > 3), 0xbbbbbb);
        rect(&c, XOF(x->xfer), y, REFIT_MAX(XOF(x->end), XOF(x->xfer) + 1), y + (int)rowh - (rowh > 3), col);
    }
    text(&c, 4, (int)top, "RX", 0x000000);
    /* Links: the busiest few by wire bytes. */
    uint32_t pick[6], np = 0;
    for (uint32_t k = 0; k < 6; k++) {
        uint32_t best = UINT32_MAX;
        for (uint32_t l = 0; l < r->nlinks; l++) {
            bool taken = false;
            for (uint32_t j = 0; j < np; j++) taken |= pick[j] == l;
            if (taken || r->links[l].wire <= 0) continue;
            if (best == UINT32_MAX || r->links[l].full_s > r->links[best].full_s ||
                (r->links[l].full_s == r->links[best].full_s && r->links[l].wire > r->links[best].wire))
                best = l;
        }
        if (best == UINT32_MAX) break;
        pick[np++] = best;
    }
    int py0 = (int)(top + bars_h + gap), py1 = py0 + (int)plot_h;
    rect(&c, (int)left, py0, (int)(W - right), py0 + 1, 0xcccccc);
    rect(&c, (int)left, py1, (int)(W - right), py1 + 1, 0x000000);
    rect(&c, (int)left - 1, py0, (int)left, py1, 0x000000);
    text(&c, 10, py0 - 3, "100%", 0x000000);
    text(&c, 22, py1 - 3, "0%", 0x000000);
    text(&c, 4, py0 + 20, "LINKS", 0x000000);
    /* Each link's utilisation averaged over bins of T/250 (chunks make it flicker). */
    enum { NB = 250 };
    for (uint32_t k = 0; k < np; k++) {
        uint32_t col = g_colors[k % 6];
        double bins[NB] = {0}, u = 0, tl = t0;
        for (size_t s = 0; s <= r->nsamples; s++) {
            bool end = s == r->nsamples;
            if (!end && r->samples[s].link != pick[k]) continue;
            double tn = end ? t0 + T : r->samples[s].t;
            int b = (int)((tl - t0) / T * NB);
            for (double a = tl; a < tn && b < NB; b++) { /* spread [tl, tn) at level u over the bins */
                double e = fmin(t0 + (double)(b + 1) * T / NB, tn);
                if (b >= 0 && e > a) bins[b] += u * (e - a) / (T / NB);
                if (e > a) a = e;
            }
            if (!end) u = r->samples[s].util, tl = tn;
        }
        int py = py1;
        for (int b = 0; b < NB; b++) {
            int x0 = (int)(left + pw * b / NB), x1 = (int)(left + pw * (b + 1) / NB);
            int y = py1 - (int)(fmin(bins[b], 1.0) * plot_h) - (int)k % 2;
            rect(&c, x0, REFIT_MIN(y, py) - 1, x0 + 2, REFIT_MAX(y, py) + 1, col);
            rect(&c, x0, y - 1, x1 + 1, y + 1, col);
            py = y;
        }
        snprintf(buf, sizeof(buf), "%s", r->links[pick[k]].name);
        rect(&c, (int)left + 10 + (int)(k % 3) * 300, py1 + 30 + (int)(k / 3) * 12, (int)left + 20 + (int)(k % 3) * 300,
             py1 + 36 + (int)(k / 3) * 12, col);
        text(&c, (int)left + 24 + (int)(k % 3) * 300, py1 + 29 + (int)(k / 3) * 12, buf, 0x000000);
    }
    /* Time axis. */
    double step = pow(10, floor(log10(T / 5)));
    if (T / step > 10) step *= 2;
    if (T / step > 10) step *= 2.5;
    for (double t = 0; t <= T * 1.0001; t += step) {
        int x = XOF(t0 + t);
        rect(&c, x, py1, x + 1, py1 + 5, 0x000000);
        snprintf(buf, sizeof(buf), "%g", t);
        text(&c, x - (int)strlen(buf) * 3, py1 + 8, buf, 0x000000);
    }
    text(&c, (int)(W / 2 - 30), py1 + 18, "SECONDS", 0x000000);
#undef XOF
    refit_status_t st = sim_png_write(path, c.px, W, H);
    free(c.px);
    return st;
}
