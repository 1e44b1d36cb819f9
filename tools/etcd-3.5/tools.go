//go:build tools

// Package tools pins the upstream etcd commands we build; nothing here is compiled into noops.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/etcdutl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
