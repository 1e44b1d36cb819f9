//go:build tools

// Package tools pins the helm command we build; nothing here is compiled into noops.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
