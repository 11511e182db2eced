/* The ucx transport, receiver side: descriptors, connecting to a publisher
 * (each of its addresses in turn, HELLO in two phases), the lanes UCX chose,
 * disconnecting. */

#include "transport/ucx/ucx_internal.h"

/* ------------------------------------------------------------------------ */
/* Receiver side: connect                                                    */

struct hello_wait {
    uint64_t cookie;
    uint32_t nregions;
    uint64_t *sizes;
    bool done;
    int32_t status;
    ucp_ep_h ep;                     /* the reply must come over it */
    uint64_t pub_id;                 /* PUB_CHALLENGE: who answered */
    uint8_t nonce[NONCE_LEN];        /* PUB_CHALLENGE */
    uint8_t proof[REFIT_SHA256_LEN]; /* PUB_CHALLENGE */
};

static ucs_status_t am_hello_reply_cb(void *arg, const void *hdr, size_t hdr_len, void *data, size_t len,
                                      const ucp_am_recv_param_t *param)
{
    refit_transport_t *t = arg;
    hello_wait_t *w = t->hello;
    hello_reply_t h;
    if (!w || hdr_len != sizeof(h) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) return UCS_OK;
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep != w->ep) return UCS_OK;
    memcpy(&h, hdr, sizeof(h));
    if (h.cookie != w->cookie) return UCS_OK;
    w->status = h.status;
    if (h.status == PUB_OK && len == (size_t)w->nregions * 8) memcpy(w->sizes, data, len);
    else if (h.status == PUB_OK) w->status = PUB_RANGE;
    if (h.status == PUB_CHALLENGE) {
        w->pub_id = h.pub_id;
        memcpy(w->nonce, h.nonce, NONCE_LEN);
        memcpy(w->proof, h.proof, sizeof(w->proof));
    }
    w->done = true;
    return UCS_OK;
}

static void peer_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    refit_peer_t *p = arg;
    if (p->failed == UCS_OK) p->failed = status == UCS_OK ? UCS_ERR_CONNECTION_RESET : status;
}


void ucx_ep_force_close(refit_transport_t *t, ucp_ep_h ep)
{
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *r = ucp_ep_close_nbx(ep, &rp);
    if (UCS_PTR_IS_PTR(r)) {
        double until = refit_now() + 2;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && refit_now() < until) ucx_progress_all(t->rw);
        ucp_request_free(r);
    }
}

/* Closes an endpoint politely (flush), waiting at most 2 s; a close still
 * in progress then finishes on its own (its request is released by UCX). */
static void ep_close(refit_transport_t *t, ucp_ep_h ep)
{
    ucp_request_param_t rp = {.op_attr_mask = 0};
    void *r = ucp_ep_close_nbx(ep, &rp);
    if (UCS_PTR_IS_PTR(r)) {
        double until = refit_now() + 2;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && refit_now() < until) ucx_rwait(t, until, 0.0005);
        ucp_request_free(r);
    }
}

static bool tl_is_rdma(const char *tl)
{
    return !strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2) || !strncmp(tl, "ud", 2) || strstr(tl, "verbs") ||
           strstr(tl, "mlx");
}

static bool tl_rma_native(const char *tl) { return !strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2); }

/* Reads which transports and devices the endpoint's lanes use, from
 * ucp_ep_print_info (lines "lane[i]: k:tl/dev.path md[..] -> ... usage...").
 * Only lanes that carry data (am, am_bw, rma, rma_bw) count. */
static void read_lanes(refit_peer_t *p)
{
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    p->lanes[0] = 0;
    p->rdma = false;
    p->tcp_only = false;
    bool any = false, all_tcp = true;
    bool rma_lane = false, rma_native = true;
    if (!f) return;
    ucp_ep_print_info(p->ep, f);
    fclose(f);
    size_t used = 0;
    for (char *line = buf, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = 0;
        char *l = strstr(line, "lane[");
        if (!l) continue;
        char *colon = strchr(l, ':');
        if (!colon) continue;
        char *tok = colon + 1;
        while (*tok == ' ') tok++;
        char *c2 = strchr(tok, ':');
        if (!c2) continue;
        tok = c2 + 1;
        size_t tl_len = strcspn(tok, " \t");
        char tldev[64];
        snprintf(tldev, sizeof(tldev), "%.*s", (int)tl_len, tok);
        char *dot = strrchr(tldev, '.'); /* ".0" path index */
        if (dot && strchr(tldev, '/') && dot > strchr(tldev, '/')) *dot = 0;
        const char *arrow = strstr(tok, "->");
        const char *usage = arrow ? strchr(arrow + 2, ' ') : NULL;
        if (!usage) continue;
        bool data = strstr(usage, " am") || strstr(usage, " rma");
        if (!data) continue;
        char tl[32];
        snprintf(tl, sizeof(tl), "%.*s", (int)strcspn(tldev, "/"), tldev);
        if (tl_is_rdma(tl)) p->rdma = true;
        any = true;
        if (strncmp(tl, "tcp", 3) != 0) all_tcp = false;
        if (strstr(usage, " rma_bw") || strstr(usage, " rma ") || strstr(usage, " rma#")) {
            rma_lane = true;
            if (!tl_rma_native(tl)) rma_native = false;
        }
        if (!strstr(p->lanes, tldev)) {
            int w = snprintf(p->lanes + used, sizeof(p->lanes) - used, "%s%s", used ? "+" : "", tldev);
            if (w > 0 && (size_t)w < sizeof(p->lanes) - used) used += (size_t)w;
        }
    }
    free(buf);
    p->tcp_only = any && all_tcp;
    int m = p->t->o.method;
    p->use_get = m == METHOD_GET || (m == METHOD_AUTO && rma_lane && rma_native && p->rdma);
}

static refit_status_t parse_desc(const void *buf, size_t len, wire_desc_t *h, const wire_addr_t **addrs,
                                 const void **rkey)
{
    if (!buf || len < sizeof(*h)) return refit_error(REFIT_ERR_CORRUPT, "ucx: descriptor of %zu bytes", len);
    memcpy(h, buf, sizeof(*h));
    if (h->magic != UCX_MAGIC) return refit_error(REFIT_ERR_CORRUPT, "ucx: not a ucx descriptor (bad magic)");
    if (h->version != UCX_DESC_VERSION)
        return refit_error(REFIT_ERR_UNSUPPORTED, "ucx: descriptor version %u (this build reads %u)", h->version,
                           UCX_DESC_VERSION);
    if (h->naddrs == 0 || h->naddrs > UCX_MAX_ADDRS ||
        len != sizeof(*h) + h->naddrs * sizeof(wire_addr_t) + (size_t)h->rkey_len)
        return refit_error(REFIT_ERR_CORRUPT, "ucx: descriptor length %zu does not match its contents", len);
    *addrs = (const wire_addr_t *)((const unsigned char *)buf + sizeof(*h));
    *rkey = (const unsigned char *)buf + sizeof(*h) + h->naddrs * sizeof(wire_addr_t);
    return REFIT_OK;
}

static void addr_str(const wire_addr_t *a, uint16_t port, char *out, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    inet_ntop(a->family, a->addr, ip, sizeof(ip));
    if (a->family == AF_INET6) snprintf(out, cap, "[%s]:%u", ip, port);
    else snprintf(out, cap, "%s:%u", ip, port);
}

static void peer_free(refit_peer_t *p)
{
    if (!p) return;
    for (uint32_t i = 0; p->regions && i < p->nregions; i++) {
        if (p->regions[i].rkey) ucp_rkey_destroy(p->regions[i].rkey);
        free(p->regions[i].rkey_buf);
    }
    free(p->regions);
    free(p);
}

/* The socket address of descriptor address a at port. */
static refit_status_t sock_addr(const wire_addr_t *a, uint16_t port, struct sockaddr_storage *ss, socklen_t *sl)
{
    memset(ss, 0, sizeof(*ss));
    if (a->family == AF_INET) {
        struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons(port);
        memcpy(&s4->sin_addr, a->addr, 4);
        *sl = sizeof(*s4);
    } else if (a->family == AF_INET6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(port);
        memcpy(&s6->sin6_addr, a->addr, 16);
        *sl = sizeof(*s6);
    } else {
        return refit_error(REFIT_ERR_CORRUPT, "ucx: descriptor address family %u", a->family);
    }
    return REFIT_OK;
}

/* Sends HELLO h (with the region ids in phase 2) and waits for its reply
 * in w (w->done), its send's completion, a failure or `until`. */
static refit_status_t send_hello(refit_transport_t *t, refit_peer_t *p, const hello_hdr_t *h, const uint64_t *ids,
                                 hello_wait_t *w, double until)
{
    ucp_request_param_t rp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER};
    void *req = ucp_am_send_nbx(p->ep, AM_HELLO, h, sizeof(*h), ids, (size_t)h->nregions * 8, &rp);
    if (UCS_PTR_IS_ERR(req))
        return ucx_err(REFIT_ERR_TRANSPORT, UCS_PTR_STATUS(req), "saying hello to publisher %s", p->name);
    while (!w->done && p->failed == UCS_OK && refit_now() < until) ucx_rwait(t, until, 0.001);
    if (req) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS && p->failed == UCS_OK && refit_now() < until)
            ucx_rwait(t, until, 0.001);
        ucp_request_free(req); /* if still in flight, closing the endpoint below completes it */
    }
    return REFIT_OK;
}

/* What the reply w to HELLO phase `phase` (h) says: REFIT_OK to go on (phase
 * 1: the publisher proved the key; phase 2: it granted the regions). */
static refit_status_t hello_verdict(refit_transport_t *t, const refit_peer_t *p, const hello_hdr_t *h,
                                    const hello_wait_t *w, uint32_t phase)
{
    uint8_t want[REFIT_SHA256_LEN];
    bool proven = false;
    if (w->done && phase == 1 && w->status == PUB_CHALLENGE) {
        ucx_conn_mac(t, "refit ucx publisher proof", p->pub_id, h->nonce, w->nonce, want);
        proven = refit_ct_equal(want, w->proof, sizeof(want));
    }
    if (!w->done && p->failed != UCS_OK) return ucx_err(REFIT_ERR_PEER, p->failed, "publisher %s", p->name);
    if (!w->done)
        return refit_error(REFIT_ERR_TIMEOUT, "ucx: publisher %s did not answer within the connect timeout", p->name);
    if (phase == 1 && proven) return REFIT_OK;
    if (phase == 1 && w->status == PUB_CHALLENGE && w->pub_id != p->pub_id)
        /* another instance answers there (the publisher restarted on this port): try the next address */
        return refit_error(REFIT_ERR_PEER, "ucx: %s is another publisher (instance changed or address reused)",
                           p->name);
    if (phase == 1)
        return refit_error(REFIT_ERR_AUTH,
                           "ucx: %s did not prove the job's secret (%s): not a publisher of this job, "
                           "or one with another secret",
                           p->name, w->status == PUB_CHALLENGE ? "wrong proof" : pub_status_str(w->status));
    if (w->status == PUB_BAD_ID) /* another publisher answered there: try the next address */
        return refit_error(REFIT_ERR_PEER, "ucx: %s is another publisher (instance changed or address reused)",
                           p->name);
    if (w->status == PUB_AUTH)
        return refit_error(REFIT_ERR_AUTH, "ucx: publisher %s refused our proof of the job's secret", p->name);
    if (w->status != PUB_OK)
        return refit_error(REFIT_ERR_PEER, "ucx: publisher %s: %s", p->name, pub_status_str(w->status));
    return REFIT_OK;
}

/* The two phases of HELLO on p's new endpoint.  Phase 1: our nonce; the
 * publisher proves the key over both nonces.  Phase 2: we prove it; then,
 * and only then, it answers about regions (their sizes, checked), and both
 * sides derive the connection's token. */
static refit_status_t hello(refit_transport_t *t, refit_peer_t *p, double until)
{
    uint64_t *ids = calloc(p->nregions ? p->nregions : 1, 8), *sizes = calloc(p->nregions ? p->nregions : 1, 8);
    refit_status_t st = REFIT_OK;
    if (!ids || !sizes) {
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
        goto out;
    }
    for (uint32_t i = 0; i < p->nregions; i++) ids[i] = p->regions[i].id;
    hello_wait_t w = {.nregions = p->nregions, .sizes = sizes, .ep = p->ep};
    hello_hdr_t h = {.magic = UCX_MAGIC, .nregions = p->nregions, .pub_id = p->pub_id};
    if ((st = refit_random_bytes(h.nonce, NONCE_LEN))) goto out;
    t->hello = &w;
    for (uint32_t phase = 1; phase <= 2 && !st; phase++) {
        w.done = false;
        w.cookie = h.cookie = ucx_random_id();
        h.phase = phase;
        h.nregions = phase == 1 ? 0 : p->nregions; /* region ids only once the key is proven */
        if (phase == 2) ucx_conn_mac(t, "refit ucx receiver proof", p->pub_id, h.nonce, w.nonce, h.proof);
        if (!(st = send_hello(t, p, &h, ids, &w, until))) st = hello_verdict(t, p, &h, &w, phase);
    }
    if (!st) {
        uint8_t tok[REFIT_SHA256_LEN];
        ucx_conn_mac(t, "refit ucx token", p->pub_id, h.nonce, w.nonce, tok);
        memcpy(p->token, tok, TOKEN_LEN);
    }
    for (uint32_t i = 0; !st && i < p->nregions; i++)
        if (sizes[i] != p->regions[i].size)
            st = refit_error(REFIT_ERR_STALE, "ucx: publisher %s: region %u is %s", p->name, i,
                             sizes[i] == UINT64_MAX ? "no longer exposed" : "of a different size");
    t->hello = NULL;
out:
    free(ids);
    free(sizes);
    return st;
}

/* Tries one address: endpoint, HELLO, reply.  *unreach: UCX found the
 * address unreachable (no route, or none of its devices reaches it), or this
 * host has no route to it: the network may not be up yet (reach retries). */
static refit_status_t try_addr(refit_transport_t *t, refit_peer_t *p, const wire_addr_t *a, uint16_t port, double until,
                               bool *unreach)
{
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    *unreach = false;
    refit_status_t st = sock_addr(a, port, &ss, &sl);
    if (st) return st;
    addr_str(a, port, p->name, sizeof(p->name));
    p->failed = UCS_OK;
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER,
                          .flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER,
                          .sockaddr = {(const struct sockaddr *)&ss, sl},
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER,
                          .err_handler = {peer_err_cb, p}};
    ucs_status_t s = ucp_ep_create(t->rw, &ep, &p->ep);
    if (s != UCS_OK) {
        p->ep = NULL;
        int e = ucx_route_probe((const struct sockaddr *)&ss, sl, NULL, 0);
        *unreach = s == UCS_ERR_UNREACHABLE || e == ENETUNREACH || e == EHOSTUNREACH;
        return ucx_err(*unreach ? REFIT_ERR_PEER : REFIT_ERR_TRANSPORT, s, "connecting to publisher %s", p->name);
    }
    if ((st = hello(t, p, until))) {
        int e = ucx_route_probe((const struct sockaddr *)&ss, sl, NULL, 0);
        *unreach = p->failed == UCS_ERR_UNREACHABLE || e == ENETUNREACH || e == EHOSTUNREACH;
        if (p->failed != UCS_OK || st == REFIT_ERR_TIMEOUT) ucx_ep_force_close(t, p->ep);
        else ep_close(t, p->ep);
        p->ep = NULL;
    }
    return st;
}

/* A peer of nregions regions from their descriptors (one publisher's);
 * *h0 and *addrs0: region 0's header and addresses. */
static refit_status_t peer_from_descs(refit_transport_t *t, const void *const *descs, const size_t *lens,
                                      uint32_t nregions, refit_peer_t **out, wire_desc_t *h0,
                                      const wire_addr_t **addrs0)
{
    refit_status_t st = REFIT_OK;
    refit_peer_t *p = calloc(1, sizeof(*p));
    if (!p || !(p->regions = calloc(nregions, sizeof(*p->regions)))) {
        free(p);
        return refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
    }
    p->t = t;
    p->nregions = nregions;
    for (uint32_t i = 0; i < nregions && !st; i++) {
        wire_desc_t h;
        const wire_addr_t *addrs = NULL;
        const void *rkey = NULL;
        if ((st = parse_desc(descs[i], lens[i], &h, &addrs, &rkey))) {
            refit_error_prefix("region %u", i);
            break;
        }
        if (i == 0) {
            *h0 = h;
            *addrs0 = addrs;
            p->pub_id = h.pub_id;
        } else if (h.pub_id != h0->pub_id) {
            st = refit_error(REFIT_ERR_INVALID_ARG, "ucx: region %u belongs to another publisher than region 0", i);
            break;
        }
        p->regions[i].id = h.region_id;
        p->regions[i].size = h.size;
        p->regions[i].base = h.base;
        if (!h.rkey_len) continue;
        if (!(p->regions[i].rkey_buf = malloc(h.rkey_len))) {
            st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
            break;
        }
        memcpy(p->regions[i].rkey_buf, rkey, h.rkey_len);
        p->regions[i].rkey_len = h.rkey_len;
    }
    if (st) peer_free(p);
    else *out = p;
    return st;
}

/* The receive worker, made on the first connect.  rlock held. */
static refit_status_t ensure_worker(refit_transport_t *t)
{
    refit_status_t st = REFIT_OK;
    if (t->rw) return REFIT_OK;
    if ((st = ucx_make_worker_in(t, t->ctx, &t->rw, &t->rw_efd, "refit-recv")) ||
        (st = ucx_set_am(t->rw, AM_HELLO_REPLY, am_hello_reply_cb, t)) ||
        (st = ucx_set_am(t->rw, AM_DATA, ucx_am_data_cb, t))) {
        if (t->rw) ucp_worker_destroy(t->rw);
        t->rw = NULL;
    }
    return st;
}

/* Makes the receive context and worker again, for UCX to see the
 * interfaces that came up since; only while no connection or pull uses the
 * worker (false otherwise, or when the new context fails: the old one
 * stays).  rlock held. */
static bool renew_context(refit_transport_t *t)
{
    if (t->peers.len || t->active.len) return false;
    ucp_context_h old = t->ctx;
    uint64_t old_sig = t->ctx_sig;
    char old_devs[sizeof(t->ctx_devs)];
    memcpy(old_devs, t->ctx_devs, sizeof(old_devs));
    if (ucx_recv_context(t)) {
        t->ctx = old;
        t->ctx_sig = old_sig;
        memcpy(t->ctx_devs, old_devs, sizeof(old_devs));
        return false;
    }
    if (t->rw) ucp_worker_destroy(t->rw);
    t->rw = NULL;
    t->rw_efd = -1;
    ucp_cleanup(old);
    refit_log(REFIT_LOG_INFO, "ucx: made the receive context again for the interfaces up now (%s)", t->ctx_devs);
    return ensure_worker(t) == REFIT_OK;
}

/* Whether this host has a route to one of the addresses through an interface
 * that is up and running. */
static bool route_up(const wire_desc_t *h0, const wire_addr_t *addrs0)
{
    char active[512];
    ucx_netif_sig(active, sizeof(active));
    for (uint16_t k = 0; k < h0->naddrs; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = 0;
        char via[IF_NAMESIZE + 1], key[IF_NAMESIZE + 3], list[sizeof(active) + 2];
        if (sock_addr(&addrs0[k], h0->port, &ss, &sl)) continue;
        if (ucx_route_probe((const struct sockaddr *)&ss, sl, via, sizeof(via))) continue;
        snprintf(key, sizeof(key), ",%s,", via);
        snprintf(list, sizeof(list), ",%s,", active);
        if (strstr(list, key)) return true;
    }
    return false;
}

/* After a round that found the publisher unreachable: waits (rlock released
 * while it sleeps) until a route to one of its addresses goes through an
 * active interface and, when the interfaces changed since the receive
 * context was made, makes it again (renew_context); at least 250 ms.  False
 * when `until` came first (no route by then: no round more).
 * *renew_blocked: the context had to be made again but connections or pulls
 * used it.  rlock held. */
static bool await_network(refit_transport_t *t, const wire_desc_t *h0, const wire_addr_t *addrs0, double until,
                          bool *renew_blocked)
{
    double earliest = refit_now() + 0.25;
    for (;;) {
        bool up = route_up(h0, addrs0);
        if (up && ucx_netif_sig(NULL, 0) != t->ctx_sig) {
            if (!renew_context(t)) *renew_blocked = true;
            return true;
        }
        double now = refit_now();
        if (up && now >= earliest) return true;
        if (now >= until) return false;
        pthread_mutex_unlock(&t->rlock);
        usleep(50 * 1000);
        pthread_mutex_lock(&t->rlock);
    }
}

/* What this host saw of the way to the publisher, for an error: the route to
 * its first address, the interfaces, the devices UCX was given. */
static void net_saw(const refit_transport_t *t, const wire_desc_t *h0, const wire_addr_t *addrs0, bool renew_blocked,
                    char *out, size_t cap)
{
    struct sockaddr_storage ss;
    socklen_t sl = 0;
    char ip[INET6_ADDRSTRLEN] = "?", via[IF_NAMESIZE + 1] = "", route[160], ifs[512];
    inet_ntop(addrs0[0].family, addrs0[0].addr, ip, sizeof(ip));
    int e = sock_addr(&addrs0[0], h0->port, &ss, &sl)
                ? EINVAL
                : ucx_route_probe((const struct sockaddr *)&ss, sl, via, sizeof(via));
    if (e) snprintf(route, sizeof(route), "this host has no route to %s (%s)", ip, strerror(e));
    else snprintf(route, sizeof(route), "the route to %s leaves through %s", ip, via);
    ucx_netif_list(ifs, sizeof(ifs));
    snprintf(out, cap,
             "%s; interfaces: %s; UCX's devices are the interfaces active when its context was made: %s%s (a network "
             "that comes up later: raise ucx.connect_timeout)",
             route, ifs, t->ctx_devs[0] ? t->ctx_devs : "none",
             renew_blocked ? " (not made again: other connections or pulls of this transport use it)" : "");
}

/* One round over the publisher's addresses until one answers as the right
 * publisher; *unreach: every one failed as unreachable (try_addr).  The
 * failures go into tried.  rlock held. */
static refit_status_t reach_round(refit_transport_t *t, refit_peer_t *p, const wire_desc_t *h0,
                                  const wire_addr_t *addrs0, double until, char *tried, size_t cap, bool *unreach)
{
    size_t tl = 0;
    refit_status_t st = REFIT_ERR_TRANSPORT;
    tried[0] = 0;
    *unreach = true;
    for (uint16_t k = 0; k < h0->naddrs && st; k++) {
        /* Each address gets its share of what is left (at least 1 s), so
         * one that drops packets cannot use up the whole budget. */
        double left = until - refit_now(), share = left / (h0->naddrs - k);
        bool u = false;
        st = try_addr(t, p, &addrs0[k], h0->port, refit_now() + (share < 1 ? REFIT_MIN(1.0, left) : share), &u);
        if (st == REFIT_ERR_STALE || st == REFIT_ERR_AUTH) break; /* reached it; it is not the right one */
        if (st) {
            *unreach = *unreach && u;
            int w = snprintf(tried + tl, cap - tl, "%s%s: %s", tl ? "; " : "", p->name, refit_last_error());
            if (w > 0 && (size_t)w < cap - tl) tl += (size_t)w;
        }
        if (refit_now() >= until) break;
    }
    if (!st || st == REFIT_ERR_STALE || st == REFIT_ERR_AUTH) *unreach = false;
    return st;
}

/* The publisher's addresses, round after round while every one is
 * unreachable (the network may not be up yet: a link still down, a route
 * not there, an interface UCX did not list when its context was made), until
 * connect_timeout; the error names every address tried and what this host
 * saw.  rlock held. */
static refit_status_t reach(refit_transport_t *t, refit_peer_t *p, const wire_desc_t *h0, const wire_addr_t *addrs0)
{
    double t0 = refit_now(), until = t0 + t->o.connect_timeout;
    char tried[512];
    bool unreach = false, renew_blocked = false;
    unsigned rounds = 0;
    refit_status_t st;
    /* This address waited a whole connect_timeout just now and the
     * interfaces did not change since: one round, no waiting again (a
     * receiver tries a source's stamp, then its bytes). */
    bool waited = t->unreach_until > t0 && !memcmp(&t->unreach_addr, &addrs0[0], sizeof(t->unreach_addr)) &&
                  t->unreach_sig == ucx_netif_sig(NULL, 0);
    for (;;) {
        st = reach_round(t, p, h0, addrs0, until, tried, sizeof(tried), &unreach);
        rounds++;
        if (!unreach || waited || refit_now() >= until) break;
        if (rounds == 1)
            refit_log(REFIT_LOG_WARN,
                      "ucx: the publisher is unreachable (%s); trying again until connect_timeout (%g s)", tried,
                      t->o.connect_timeout);
        if (!await_network(t, h0, addrs0, until, &renew_blocked) || !t->rw) break; /* !rw: a new worker failed */
    }
    if (st && unreach && !waited) {
        t->unreach_addr = addrs0[0];
        t->unreach_sig = ucx_netif_sig(NULL, 0);
        t->unreach_until = refit_now() + t->o.connect_timeout;
    }
    if (!st && rounds > 1)
        refit_log(REFIT_LOG_INFO, "ucx: reached publisher %s after %.1f s (%u tries)", p->name, refit_now() - t0,
                  rounds);
    if (st && st != REFIT_ERR_STALE && st != REFIT_ERR_AUTH) {
        char saw[1536] = "";
        if (unreach) net_saw(t, h0, addrs0, renew_blocked, saw, sizeof(saw));
        char within[64] = "";
        if (unreach) snprintf(within, sizeof(within), " within connect_timeout (%g s)", t->o.connect_timeout);
        st = refit_error(st == REFIT_ERR_TIMEOUT ? REFIT_ERR_TIMEOUT : REFIT_ERR_PEER,
                         "ucx: cannot reach the publisher at any of its %u addresses%s (%s)%s%s", h0->naddrs, within,
                         tried, saw[0] ? "; " : "", saw);
    }
    return st;
}

/* A connected peer's lanes (require=rdma checked) and remote keys (needed
 * with method=get); on failure its endpoint is closed.  rlock held. */
static refit_status_t after_connect(refit_transport_t *t, refit_peer_t *p)
{
    refit_status_t st = REFIT_OK;
    read_lanes(p);
    if (t->o.require_rdma && !p->rdma) {
        st = refit_error(REFIT_ERR_TRANSPORT,
                         "ucx: require=rdma, but UCX connected publisher %s over %s only (no RDMA lane; "
                         "check the RDMA devices, UCX_TLS and UCX_NET_DEVICES)",
                         p->name, p->lanes[0] ? p->lanes : "unknown lanes");
        ep_close(t, p->ep);
        p->ep = NULL;
    }
    for (uint32_t i = 0; !st && i < p->nregions; i++) {
        if (!p->regions[i].rkey_len) continue;
        ucs_status_t s = ucp_ep_rkey_unpack(p->ep, p->regions[i].rkey_buf, &p->regions[i].rkey);
        if (s == UCS_OK) continue;
        p->regions[i].rkey = NULL;
        if (p->use_get) {
            st = ucx_err(REFIT_ERR_TRANSPORT, s, "unpacking the remote key of region %u of publisher %s", i, p->name);
            ep_close(t, p->ep);
            p->ep = NULL;
        }
    }
    return st;
}

refit_status_t ucx_connect(refit_transport_t *t, const void *const *descs, const size_t *lens, uint32_t nregions,
                           refit_peer_t **out)
{
    if (!t || !out || (nregions && (!descs || !lens)))
        return refit_error(REFIT_ERR_INVALID_ARG, "ucx: connect: NULL argument");
    if (nregions == 0) return refit_error(REFIT_ERR_INVALID_ARG, "ucx: connect: no regions");
    refit_peer_t *p = NULL;
    wire_desc_t h0;
    const wire_addr_t *addrs0 = NULL;
    refit_status_t st = peer_from_descs(t, descs, lens, nregions, &p, &h0, &addrs0);
    if (st) return st;
    pthread_mutex_lock(&t->rlock);
    if (!(st = ensure_worker(t)) && REFIT_VEC_RESERVE(&t->peers, t->peers.len + 1))
        st = refit_error(REFIT_ERR_NO_MEMORY, "ucx: connect");
    if (!st && !(st = reach(t, p, &h0, addrs0)) && !(st = after_connect(t, p))) t->peers.data[t->peers.len++] = p;
    pthread_mutex_unlock(&t->rlock);
    if (st) {
        peer_free(p);
        return st;
    }
    *out = p;
    return REFIT_OK;
}

void ucx_disconnect(refit_peer_t *p)
{
    if (!p) return;
    refit_transport_t *t = p->t;
    if (t) {
        pthread_mutex_lock(&t->rlock);
        for (uint32_t i = 0; i < p->nregions; i++)
            if (p->regions[i].rkey) ucp_rkey_destroy(p->regions[i].rkey), p->regions[i].rkey = NULL;
        if (p->ep) {
            if (p->failed != UCS_OK || p->broken) ucx_ep_force_close(t, p->ep);
            else ep_close(t, p->ep);
            p->ep = NULL;
        }
        for (size_t i = 0; i < t->peers.len; i++)
            if (t->peers.data[i] == p) {
                t->peers.data[i] = t->peers.data[--t->peers.len];
                break;
            }
        pthread_mutex_unlock(&t->rlock);
    }
    peer_free(p);
}
