/*
 * bulk: a TCP transfer with every byte checked, for the attached path of
 * the sockets shim (it needs nothing of the shim: run it with and without).
 *
 *   bulk server [-p PORT]            serve one connection at a time, forever
 *   bulk client [-p PORT] [-n BYTES] [-r ROUNDS] [-s SIZE] [-w MS] ADDR
 *
 * The client sends BYTES (a seeded pattern), the server checks them and
 * sends BYTES back, which the client checks; then ROUNDS ping-pongs of
 * SIZE bytes each way (each checked); then both close. The client waits
 * MS milliseconds (default 200) after sending the header, before the
 * timed part: the shim attaches a connection asynchronously (run it with
 * RDMAPLUS_SOCKETS_ATTACH_MS=0, so that the header's write starts it). The
 * client prints
 * "ok bulk BYTES" with its times. Exit status non-zero on any failure.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	fprintf(stderr, "FAIL bulk: %s: %s\n", what, strerror(errno));
	exit(1);
}

static uint8_t pat(uint64_t off, unsigned seed)
{
	uint64_t x = (off + 1) * 0x9e3779b97f4a7c15ull ^ seed;

	return (uint8_t)(x >> 29);
}

static void send_all(int fd, uint64_t n, unsigned seed)
{
	static uint8_t buf[65536];
	uint64_t off = 0;

	while (off < n) {
		size_t m = n - off < sizeof(buf) ? (size_t)(n - off) : sizeof(buf);
		ssize_t w;

		for (size_t i = 0; i < m; i++)
			buf[i] = pat(off + i, seed);
		w = write(fd, buf, m);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			die("write");
		off += (uint64_t)w;
	}
}

static void recv_all(int fd, uint64_t n, unsigned seed)
{
	static uint8_t buf[65536];
	uint64_t off = 0;

	while (off < n) {
		size_t m = n - off < sizeof(buf) ? (size_t)(n - off) : sizeof(buf);
		ssize_t r = read(fd, buf, m);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("read");
		if (r == 0) {
			fprintf(stderr, "FAIL bulk: end of file at %llu of %llu\n",
				(unsigned long long)off, (unsigned long long)n);
			exit(1);
		}
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != pat(off + (uint64_t)i, seed)) {
				fprintf(stderr, "FAIL bulk: byte %llu is %u, want %u\n",
					(unsigned long long)(off + (uint64_t)i), buf[i],
					pat(off + (uint64_t)i, seed));
				exit(1);
			}
		off += (uint64_t)r;
	}
}

struct hdr {
	uint64_t bytes, rounds, size;
};

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void serve(int c)
{
	struct hdr h;
	char end;

	{
		size_t got = 0;

		while (got < sizeof(h)) {
			ssize_t r = read(c, (char *)&h + got, sizeof(h) - got);

			if (r <= 0)
				die("read header");
			got += (size_t)r;
		}
	}
	recv_all(c, h.bytes, 1);
	send_all(c, h.bytes, 2);
	for (uint64_t i = 0; i < h.rounds; i++) {
		recv_all(c, h.size, (unsigned)(10 + i));
		send_all(c, h.size, (unsigned)(20 + i));
	}
	if (read(c, &end, 1) != 0)
		die("end of file");
	close(c);
}

int main(int argc, char **argv)
{
	int port = 7481, opt;
	uint64_t bytes = 16 << 20, rounds = 1000, size = 64, wait_ms = 200;

	if (argc < 2)
		return 2;
	optind = 2;
	while ((opt = getopt(argc, argv, "p:n:r:s:w:")) != -1) {
		switch (opt) {
		case 'p': port = atoi(optarg); break;
		case 'n': bytes = strtoull(optarg, NULL, 0); break;
		case 'r': rounds = strtoull(optarg, NULL, 0); break;
		case 's': size = strtoull(optarg, NULL, 0); break;
		case 'w': wait_ms = strtoull(optarg, NULL, 0); break;
		default: return 2;
		}
	}
	if (!strcmp(argv[1], "server")) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
		int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

		signal(SIGCHLD, SIG_IGN);
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(l, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(l, 16) < 0)
			die("listen");
		for (;;) {
			int c = accept(l, NULL, NULL);

			if (c < 0)
				die("accept");
			serve(c);
		}
	}
	if (!strcmp(argv[1], "client") && optind < argc) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
		struct hdr h = { bytes, rounds, size };
		int c = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		double t0, t1, t2;

		if (inet_pton(AF_INET, argv[optind], &a.sin_addr) != 1)
			return 2;
		if (connect(c, (struct sockaddr *)&a, sizeof(a)) < 0)
			die("connect");
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (write(c, &h, sizeof(h)) != sizeof(h))
			die("write header");
		usleep((useconds_t)(wait_ms * 1000));	/* the attachment, if any, is up */
		t0 = now();
		send_all(c, bytes, 1);
		recv_all(c, bytes, 2);
		t1 = now();
		for (uint64_t i = 0; i < rounds; i++) {
			send_all(c, size, (unsigned)(10 + i));
			recv_all(c, size, (unsigned)(20 + i));
		}
		t2 = now();
		close(c);
		printf("ok bulk %llu bytes each way in %.3f s (%.1f MB/s); %llu round trips of %llu B: %.1f us each\n",
		       (unsigned long long)bytes, t1 - t0, 2.0 * (double)bytes / (t1 - t0) / 1e6,
		       (unsigned long long)rounds, (unsigned long long)size,
		       rounds ? (t2 - t1) / (double)rounds * 1e6 : 0.0);
		return 0;
	}
	return 2;
}
