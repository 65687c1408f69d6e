/* http: connection plumbing shared by the server's routes: answers,
 * the API key check and the slow-client watchdog (deadlines that a
 * trickling client cannot move). */
#ifndef LOOM_SERVE_HTTP_H
#define LOOM_SERVE_HTTP_H

#include <microhttpd.h>

#include "serve/job.h"

/* Content-Type, and the CORS headers with --cors. */
void http_add_common_headers(server *s, struct MHD_Response *resp, const char *type);
/* Queues text (owned, freed by MHD; NULL: a 500 out of memory). */
enum MHD_Result http_send_text(server *s, struct MHD_Connection *conn, int status,
                               const char *type, char *text);
/* Counts err under endpoint's label and queues its JSON. */
enum MHD_Result http_send_error(server *s, struct MHD_Connection *conn, const char *endpoint,
                                const api_error *err);
/* The bearer token matches --api-key, or none is asked for. */
int http_authorized(server *s, struct MHD_Connection *conn);

/* The watchdog's hooks: MHD's connection notifier and URI log callback,
 * then headers in (the body is due), request received (no deadline), and
 * request done (a kept-alive connection waits for its next one).
 * http_watchdog is the thread, until s->watch_stop; s->watch_lock must be
 * initialised first. */
void http_on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                        enum MHD_ConnectionNotificationCode toe);
void *http_on_request_line(void *cls, const char *uri, struct MHD_Connection *conn);
void http_watch_headers_done(server *s, struct MHD_Connection *conn);
void http_watch_received(server *s, struct MHD_Connection *conn);
void http_watch_idle(server *s, struct MHD_Connection *conn);
void *http_watchdog(void *arg);

#endif
