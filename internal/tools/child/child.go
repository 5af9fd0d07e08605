// Package child holds what the measurement and try programs share to start
// the agent and its peers as child processes: free loopback ports and an
// environment without the developer's own agent settings.
package child

import (
	"net"
	"os"
	"strings"
)

// Env is this process's environment without the agent's own variables
// (OPAL_*, and the Python image's UVICORN_*, whose UVICORN_PORT wins over
// OPAL_CLIENT_API_SERVER_PORT), followed by extra: a developer's settings do
// not change what a child measures or tries.
func Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OPAL_") && !strings.HasPrefix(kv, "UVICORN_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// FreePorts asks the kernel for n free loopback ports and releases them.
// All n are held until the last is picked, so they differ from one another;
// another process may still take one before the child binds it, which the
// child reports loudly by failing to start.
func FreePorts(n int) ([]string, error) {
	ports := make([]string, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		_, port, err := net.SplitHostPort(ln.Addr().String())
		if err != nil {
			return nil, err
		}
		ports = append(ports, port)
	}
	return ports, nil
}
