/* The pod sandbox ("pause") process of the local cluster's pause image: it holds the pod's
 * namespaces, reaps zombies, and exits on SIGINT/SIGTERM. Built statically with the system
 * gcc by hack/images.sh (the upstream pause image cannot be pulled here). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }
static void on_chld(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "-v") == 0) {
    puts("fgpu pause");
    return 0;
  }
  if (getpid() != 1) fprintf(stderr, "pause: warning: not pid 1\n");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_term;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = on_chld;
  sa.sa_flags = SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);
  for (;;) pause();
  return 1;
}
