package config

import (
	"errors"
	"strings"
)

// The markers around the generated table in docs/configuration.md.
const (
	DocTableBegin = "<!-- BEGIN settings table: generated from config/table.go by `go run ./config/gendoc`; do not edit -->"
	DocTableEnd   = "<!-- END settings table -->"
)

// DocTable renders the settings table as the docs show it: one markdown
// table per section, in table order, "(ours)" after this agent's own names.
func DocTable() string {
	var b strings.Builder
	for i, sec := range sections {
		if i > 0 {
			b.WriteString("\n")
		}
		b.WriteString("### " + sec.title + "\n\n")
		if sec.intro != "" {
			b.WriteString(sec.intro + "\n\n")
		}
		if sec.id == "notread" {
			b.WriteString("| variable | Python default | what happens instead |\n| --- | --- | --- |\n")
		} else {
			b.WriteString("| variable | default | notes |\n| --- | --- | --- |\n")
		}
		for _, s := range settings {
			if s.section != sec.id {
				continue
			}
			name := "`" + s.name + "`"
			if s.origin == ours {
				name += " **(ours)**"
			}
			b.WriteString("| " + name + " | " + cell(s.def) + " | " + cell(s.doc) + " |\n")
		}
	}
	return b.String()
}

func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

// ReplaceDocTable returns doc with the text between DocTableBegin and
// DocTableEnd replaced by DocTable.
func ReplaceDocTable(doc string) (string, error) {
	before, rest, ok := strings.Cut(doc, DocTableBegin)
	if !ok {
		return "", errors.New("docs: no " + DocTableBegin + " line")
	}
	_, after, ok := strings.Cut(rest, DocTableEnd)
	if !ok {
		return "", errors.New("docs: no " + DocTableEnd + " line")
	}
	return before + DocTableBegin + "\n\n" + DocTable() + "\n" + DocTableEnd + after, nil
}
