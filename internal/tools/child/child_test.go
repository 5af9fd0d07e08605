package child

import (
	"strings"
	"testing"
)

func TestEnv(t *testing.T) {
	t.Setenv("OPAL_SERVER_URL", "http://elsewhere")
	t.Setenv("UVICORN_PORT", "9999")
	t.Setenv("UVICORN_NUM_WORKERS", "4")
	env := Env("OPAL_LOG_LEVEL=WARNING")
	// guard: mutation: the filter always true (the developer's OPAL_ settings leak into what is measured)
	for _, kv := range env {
		if strings.HasPrefix(kv, "OPAL_SERVER_URL=") || strings.HasPrefix(kv, "UVICORN_") {
			t.Fatalf("inherited %s", kv)
		}
	}
	if env[len(env)-1] != "OPAL_LOG_LEVEL=WARNING" {
		t.Fatal("extra variable lost")
	}
}

func TestFreePortsDistinct(t *testing.T) {
	ports, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 3 || ports[0] == ports[1] || ports[1] == ports[2] || ports[0] == ports[2] {
		t.Fatalf("ports %v, want 3 distinct", ports)
	}
}
