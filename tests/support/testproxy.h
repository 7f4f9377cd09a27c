/*
 * Test support: a TCP proxy on 127.0.0.1 between a client (a guard handle) and a server, which
 * delays or cuts what goes through it on demand, so that a test can make the network fail at a
 * chosen point of an exchange.
 *
 * The proxy runs on a thread of its own and forwards every connection accepted on its port to
 * 127.0.0.1:<upstream>, connecting there anew for every client (so it follows a server restarted
 * on the same port). Armed with a cut, it cuts the next exchange a client starts: it takes in
 * the whole pipeline the client sends (until the client has been quiet for 100 ms, scaled), then
 *   WXG_TEST_CUT_REQUESTS: forwards the first half of its bytes (the server runs the commands in
 *     that half and never sees the rest, the one cut through included), half-closes, forwards
 *     the replies the server sends to those and closes both sides;
 *   WXG_TEST_CUT_REPLIES: forwards all of it, takes in the server's replies until it has been
 *     quiet as long, forwards the first half of their bytes and closes both sides.
 * A delay holds every chunk from a client that long before it goes on (a stalled network or a
 * stalled client), for every connection, until set back to 0. Every wait inside the proxy is
 * bounded (5 s, scaled, per exchange cut) and it touches no cmocka state, so any thread may
 * call the functions below; each takes the proxy's lock.
 */
#ifndef WXG_TESTPROXY_H
#define WXG_TESTPROXY_H

#include <stddef.h>

enum { WXG_TEST_CUT_NONE = 0, WXG_TEST_CUT_REQUESTS = 1, WXG_TEST_CUT_REPLIES = 2 };

typedef struct wxg_test_proxy wxg_test_proxy_t;

/* What the last cut let through, in bytes. */
typedef struct wxg_test_proxy_cut {
    int cuts; /* cuts made since the start */
    size_t req_total, req_sent, rep_total, rep_sent;
} wxg_test_proxy_cut_t;

/* Starts a proxy to 127.0.0.1:upstream on a port of its own; NULL (with the reason printed)
 * when it cannot listen or start its thread. */
wxg_test_proxy_t *wxg_test_proxy_start(int upstream);

/* The port clients connect to. */
int wxg_test_proxy_port(const wxg_test_proxy_t *p);

/* Arms a cut of the next exchange (WXG_TEST_CUT_*); WXG_TEST_CUT_NONE disarms. The cut disarms
 * itself once made. */
void wxg_test_proxy_arm(wxg_test_proxy_t *p, int how);

/* The cut armed now (WXG_TEST_CUT_NONE once it was made). */
int wxg_test_proxy_armed(wxg_test_proxy_t *p);

/* Holds every chunk from a client `ms` milliseconds (0: none) from now on. */
void wxg_test_proxy_set_delay(wxg_test_proxy_t *p, int ms);

/* Closes every connection going through the proxy now (both sides), whatever is in flight:
 * the client sees its connection closed at its next read or write. New connections are
 * accepted as before. */
void wxg_test_proxy_drop(wxg_test_proxy_t *p);

/* The figures of the last cut. */
void wxg_test_proxy_last_cut(wxg_test_proxy_t *p, wxg_test_proxy_cut_t *out);

/* Stops the thread, closes every connection and frees the proxy. NULL is accepted. */
void wxg_test_proxy_stop(wxg_test_proxy_t *p);

#endif /* WXG_TESTPROXY_H */
