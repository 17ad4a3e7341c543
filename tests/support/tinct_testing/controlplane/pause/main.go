// The sandbox process of the end-to-end node's Pods: PID 1 of each Pod's namespaces.
//
// It holds the namespaces while the Pod lives, reaps the children that get orphaned into
// it, and exits at once on SIGTERM or SIGINT (a PID 1 that ignored them would hold a
// Pod's deletion for its whole grace period).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
