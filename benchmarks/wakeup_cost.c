/* What one thread waking another costs on this machine: the floor under every ZeroMQ message.
 *
 * libzmq moves each message between an application thread and its I/O thread by writing to an
 * eventfd that the other thread sleeps on in epoll_wait. Two threads here pass a token back and
 * forth the same way, ROUNDS times, and the program prints the wall time and the CPU time (both
 * threads) per round trip. Run it as is (the kernel may put the threads on different CPUs) and
 * pinned to one CPU; the difference is what a cross-CPU wake-up costs:
 *
 *     cc -O2 -pthread benchmarks/wakeup_cost.c -o /tmp/wakeup_cost
 *     /tmp/wakeup_cost && taskset -c 0 /tmp/wakeup_cost
 *
 * Not a test and not run by `nox -s bench`; docs/performance.md quotes it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum { ROUNDS = 200000 };

static int ping, pong; /* eventfds: main -> other, other -> main */

static int watch(int fd) {
    int ep = epoll_create1(0);
    struct epoll_event event = {.events = EPOLLIN, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &event);
    return ep;
}

static void pass(int ep, int from, int to) {
    struct epoll_event event;
    uint64_t value;
    epoll_wait(ep, &event, 1, -1);
    if (read(from, &value, sizeof value) != sizeof value) return;
    value = 1;
    if (write(to, &value, sizeof value) != sizeof value) return;
}

static void *other(void *unused) {
    (void)unused;
    int ep = watch(ping);
    for (int i = 0; i < ROUNDS; i++) pass(ep, ping, pong);
    return NULL;
}

static double seconds(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }

int main(void) {
    ping = eventfd(0, 0);
    pong = eventfd(0, 0);
    pthread_t thread;
    pthread_create(&thread, NULL, other, NULL);
    int ep = watch(pong);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    uint64_t one = 1;
    for (int i = 0; i < ROUNDS; i++) {
        if (write(ping, &one, sizeof one) != sizeof one) return 1;
        struct epoll_event event;
        uint64_t value;
        epoll_wait(ep, &event, 1, -1);
        if (read(pong, &value, sizeof value) != sizeof value) return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    pthread_join(thread, NULL);
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    double wall = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    double cpu = seconds(usage.ru_utime) + seconds(usage.ru_stime);
    printf("per round trip: %.2f us wall, %.2f us CPU (both threads)\n",
           wall / ROUNDS * 1e6, cpu / ROUNDS * 1e6);
    return 0;
}
