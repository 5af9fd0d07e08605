// Command gendoc rewrites the settings table of docs/configuration.md from
// config/table.go. Run it from the repository root after changing a row:
//
//	go run ./config/gendoc
package main

import (
	"fmt"
	"os"

	"github.com/opal-go/opal-client/config"
)

const path = "docs/configuration.md"

func main() {
	b, err := os.ReadFile(path)
	if err != nil {
		fail(err)
	}
	out, err := config.ReplaceDocTable(string(b))
	if err != nil {
		fail(err)
	}
	if out == string(b) {
		return
	}
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		fail(err)
	}
	fmt.Println("rewrote the settings table of", path)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "gendoc:", err)
	os.Exit(1)
}
