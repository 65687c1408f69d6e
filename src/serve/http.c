/* http: what every connection gets, whatever its route: the common
 * headers, answers from a heap string, the API key check, and the
 * slow-client watchdog, kept apart from routing and the lifecycle so that
 * server.c reads as the daemon and its table. */
#include "serve/http.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"

void http_add_common_headers(server *s, struct MHD_Response *resp, const char *type) {
    MHD_add_response_header(resp, "Content-Type", type);
    if (s->p.cors) {
        MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
        MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type, X-Loom-Trace, "
                                "x-api-key, anthropic-version, anthropic-beta");
        MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    }
}

enum MHD_Result http_send_text(server *s, struct MHD_Connection *conn, int status,
                               const char *type, char *text) {
    if (!text) {
        static char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
        struct MHD_Response *r = MHD_create_response_from_buffer(strlen(oom), oom, MHD_RESPMEM_PERSISTENT);
        http_add_common_headers(s, r, "application/json");
        enum MHD_Result ret = MHD_queue_response(conn, 500, r);
        MHD_destroy_response(r);
        return ret;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    http_add_common_headers(s, r, type);
    enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result http_send_error(server *s, struct MHD_Connection *conn, const char *endpoint,
                                const api_error *err) {
    metrics_count_request(&s->metrics, endpoint, err->status);
    return http_send_text(s, conn, err->status, "application/json", api_error_json(err));
}

/* Authorization: Bearer KEY, or Anthropic's x-api-key: KEY. */
int http_authorized(server *s, struct MHD_Connection *conn) {
    if (!s->p.api_key) return 1;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
    if ((!h || strncmp(h, "Bearer ", 7) != 0) && !x) return 0;
    const char *k = h && !strncmp(h, "Bearer ", 7) ? h + 7 : x, *want = s->p.api_key;
    size_t a = strlen(k), b = strlen(want);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned)(k[i] ^ want[i]);
    return diff == 0;
}

/* ---- slow clients ------------------------------------------------------------ */

/* MHD's connection timeout restarts with every byte read, so a client that
 * trickles its request holds a connection, and its thread, for as long as
 * it likes; a few hundred of them starve everyone. So each connection has
 * a deadline that trickling does not move: the request line and headers
 * within --header-timeout of the connection, or of a kept-alive
 * connection's next request line (the wait for which --timeout bounds),
 * and the body within --body-timeout of the headers. A watchdog thread
 * shuts down the socket of a request past its deadline. A request fully
 * received has none, so a long answer or stream is never cut. */
typedef struct conn_watch {
    struct conn_watch *prev, *next;
    int fd;
    int idle;          /* between two requests of a kept-alive connection */
    double deadline;   /* loom_now() seconds; 0: none */
} conn_watch;

static conn_watch *watch_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static void watch_set(server *s, conn_watch *w, int idle, double seconds) {
    if (!w) return;
    pthread_mutex_lock(&s->watch_lock);
    w->idle = idle;
    w->deadline = seconds > 0 ? loom_now() + seconds : 0;
    pthread_mutex_unlock(&s->watch_lock);
}

void http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe) {
    server *s = cls;
    conn_watch *w = *socket_context;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        if (!(w = calloc(1, sizeof *w))) return; /* unwatched, as MHD alone would */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        w->fd = ci ? ci->connect_fd : -1;
        w->deadline = loom_now() + s->p.header_timeout_s;
        pthread_mutex_lock(&s->watch_lock);
        w->next = s->watched;
        if (w->next) w->next->prev = w;
        s->watched = w;
        pthread_mutex_unlock(&s->watch_lock);
        *socket_context = w;
        return;
    }
    if (!w) return;
    /* MHD closes the socket after this, so the http_watchdog, which holds the
     * lock while it shuts sockets down, never touches a reused fd */
    pthread_mutex_lock(&s->watch_lock);
    if (w->prev) w->prev->next = w->next;
    else s->watched = w->next;
    if (w->next) w->next->prev = w->prev;
    pthread_mutex_unlock(&s->watch_lock);
    free(w);
    *socket_context = NULL;
}

/* The request line of a kept-alive connection's next request: the headers
 * are due from now. */
void *http_on_request_line(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)uri;
    server *s = cls;
    conn_watch *w = watch_of(conn);
    if (w && w->idle) watch_set(s, w, 0, s->p.header_timeout_s);
    return NULL;
}

void http_watch_headers_done(server *s, struct MHD_Connection *conn) {
    watch_set(s, watch_of(conn), 0, s->p.body_timeout_s);
}

void http_watch_received(server *s, struct MHD_Connection *conn) {
    watch_set(s, watch_of(conn), 0, 0);
}

void http_watch_idle(server *s, struct MHD_Connection *conn) {
    watch_set(s, watch_of(conn), 1, s->p.timeout_s + s->p.header_timeout_s);
}

void *http_watchdog(void *arg) {
    server *s = arg;
    while (!atomic_load(&s->watch_stop)) {
        double now = loom_now();
        pthread_mutex_lock(&s->watch_lock);
        for (conn_watch *w = s->watched; w; w = w->next)
            if (w->deadline > 0 && now > w->deadline && w->fd >= 0) {
                shutdown(w->fd, SHUT_RDWR); /* its thread sees the end and closes it */
                w->deadline = 0;
            }
        pthread_mutex_unlock(&s->watch_lock);
        usleep(100000);
    }
    return NULL;
}
