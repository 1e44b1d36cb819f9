//go:build tools

// Package tools pins the upstream versitygw command we build; nothing here is compiled into noops.
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
