/* The floor of any relay in user space, in C: a TCP byte pipe on one epoll loop, no HTTP parsed. Each
 * client connection gets its own upstream connection; what arrives on either side is written to the
 * other as it comes (one read, one write a chunk: what a relay that forwards each chunk as it arrives
 * cannot do without). A write that would block parks the bytes and stops reading the other side until
 * this side drains. bench/router_latency.py --c-floor builds and runs it beside the routers, so the
 * kernel's share of a chunk (loopback send and receive, wake-ups) is measured with no interpreter on top.
 *
 * Usage: relay_floor PORT UPSTREAM_PORT   (both on 127.0.0.1; runs until killed) */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF 65536

struct side {
    int fd;
    struct side *peer;
    char *pending; /* bytes read from the peer, not yet written here */
    size_t len, off;
    int listening;
};

static int ep;
static struct side dead; /* events of a pair dropped earlier in the same batch point here */

static void watch(struct side *s, unsigned events, int op) {
    struct epoll_event ev = {.events = events, .data.ptr = s};
    epoll_ctl(ep, op, s->fd, &ev);
}

static void nonblocking(int fd) {
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void drop(struct side *s) {
    struct side *p = s->peer;
    close(s->fd);
    free(s->pending);
    if (p) {
        close(p->fd);
        free(p->pending);
        free(p);
    }
    free(s);
}

/* What is parked for `s` written; 1 when all of it went. */
static int flush(struct side *s) {
    while (s->off < s->len) {
        ssize_t n = write(s->fd, s->pending + s->off, s->len - s->off);
        if (n < 0) {
            if (errno == EAGAIN) return 0;
            return -1;
        }
        s->off += (size_t)n;
    }
    s->len = s->off = 0;
    return 1;
}

/* `from` readable: one read, written to its peer (parked if the peer is full). */
static int pump(struct side *from) {
    static char buf[BUF];
    struct side *to = from->peer;
    ssize_t n = read(from->fd, buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return -1;
    if (n < 0) return 0;
    ssize_t w = write(to->fd, buf, (size_t)n);
    if (w < 0 && errno != EAGAIN) return -1;
    if (w < 0) w = 0;
    if (w < n) { /* the peer is full: park the rest, stop reading `from` until it drains */
        to->pending = realloc(to->pending, (size_t)(n - w));
        memcpy(to->pending, buf + w, (size_t)(n - w));
        to->len = (size_t)(n - w);
        to->off = 0;
        watch(to, EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
        watch(from, 0, EPOLL_CTL_MOD);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s PORT UPSTREAM_PORT\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct sockaddr_in upstream = addr;
    addr.sin_port = htons((unsigned short)atoi(argv[1]));
    upstream.sin_port = htons((unsigned short)atoi(argv[2]));
    int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 1024)) {
        perror("listen");
        return 1;
    }
    ep = epoll_create1(0);
    struct side listener = {.fd = lfd, .listening = 1};
    watch(&listener, EPOLLIN, EPOLL_CTL_ADD);
    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        for (int i = 0; i < n; i++) {
            struct side *s = events[i].data.ptr;
            if (s->listening) {
                int cfd = accept(lfd, NULL, NULL);
                if (cfd < 0) continue;
                int ufd = socket(AF_INET, SOCK_STREAM, 0);
                if (connect(ufd, (struct sockaddr *)&upstream, sizeof upstream)) { /* blocking: set-up only */
                    close(cfd);
                    close(ufd);
                    continue;
                }
                nonblocking(cfd);
                nonblocking(ufd);
                struct side *c = calloc(1, sizeof *c), *u = calloc(1, sizeof *u);
                c->fd = cfd;
                u->fd = ufd;
                c->peer = u;
                u->peer = c;
                watch(c, EPOLLIN, EPOLL_CTL_ADD);
                watch(u, EPOLLIN, EPOLL_CTL_ADD);
                continue;
            }
            if (s == &dead) continue;
            int bad = (events[i].events & EPOLLERR) != 0;
            if (events[i].events & EPOLLOUT) {
                int r = flush(s);
                if (r < 0) bad = 1;
                else if (r > 0) { /* drained: read the other side again */
                    watch(s, EPOLLIN, EPOLL_CTL_MOD);
                    watch(s->peer, EPOLLIN, EPOLL_CTL_MOD);
                }
            }
            if (!bad && (events[i].events & (EPOLLIN | EPOLLHUP))) {
                if (s->peer->len == 0) bad = pump(s) < 0;
                else if (events[i].events & EPOLLHUP) bad = 1; /* gone with bytes still parked for its peer */
            }
            if (bad) {
                /* The pair closed together; later events of this batch for either side must not touch it. */
                for (int j = i + 1; j < n; j++)
                    if (events[j].data.ptr == s || events[j].data.ptr == s->peer) events[j].data.ptr = &dead;
                drop(s);
            }
        }
    }
}
