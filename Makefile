# noops: Kubernetes operators in Rust, and the local Kubernetes they are shown on.
# `make demo` and `make test` each set up everything they need on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help
export KUBECONFIG := $(CURDIR)/.noops/kubeconfig

.PHONY: help setup cluster-up cluster-down demo test unit e2e e2e-real chaos lint feature-drift bench crds run

# Nodes of the local Kubernetes: `make cluster-up` starts NODES (default 1, at most 16); the
# end-to-end tests need three.
NODES ?= 1
E2E_NODES ?= 3
# The demo's tenant cluster spreads its etcd members and machines over three nodes.
DEMO_NODES ?= 3

help: ## Show the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-z0-9-]+:.*## / { printf "  make %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

setup: ## Install packages, build upstream binaries (cached) and the Rust workspace
	@hack/setup.sh

cluster-up: setup ## Start the local Kubernetes with NODES nodes (default 1; NODES=3 make cluster-up), in NODE_ZONES zones (default 1)
	@NODES=$(NODES) hack/cluster-up.sh

cluster-down: ## Stop the local Kubernetes and remove its state (logs stay in .noops/logs)
	@hack/cluster-down.sh

demo: ## The local Kubernetes (3 nodes), a maintenance switch, etcd and PostgreSQL healing from a stopped node, a whole cluster upgraded under load
	@NOOPS_UPSTREAM=demo hack/setup.sh
	@source hack/lib.sh && use_node_kind agent
	@NODE_KIND=agent NODES=$(DEMO_NODES) hack/cluster-up.sh
	@hack/demo.sh

lint: ## cargo fmt --check and clippy with warnings as errors
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

feature-drift: ## Fail when the tests build a dependency again with other features than the binaries (crates/workspace-hack)
	@hack/feature-drift.sh

unit: ## Unit tests (no cluster)
	cargo test --workspace --quiet --lib --bins

e2e: setup ## End-to-end tests (hack/e2e.sh): on node agents (3 nodes) every binary but those real nodes run, 4 at a time (2 with tenant clusters), longest first, then the ignored ones (node faults, a loosened schema) alone; then on real nodes (upstream kubelet, containerd, images built here; 6 nodes in two zones) the etcd, PostgreSQL, MaintPage, plugin and exec/cp/port-forward tests, operators installed by the Helm chart, in one zone beside the node faults of etcd and PostgreSQL in the other, then every node rebooting at once and the repeated primary faults, alone
	@RUST_BACKTRACE=0 hack/e2e.sh agent real

e2e-real: setup ## Only the real-node part of make e2e (a cluster of the other kind is stopped first)
	@RUST_BACKTRACE=0 hack/e2e.sh real

chaos: setup ## Long fault runs: hundreds of node kills, etcd and PostgreSQL faults (NOOPS_CHAOS_NODE_KILLS, NOOPS_CHAOS_ETCD_FAULTS, NOOPS_CHAOS_PG_FAULTS, default 200 each; NOOPS_CHAOS_ETCD_MAJORITY_FAULTS, 60), 500 faults of a PostgreSQL primary with replicas (NOOPS_CHAOS_PG_HA_FAULTS), management nodes under a whole cluster (NOOPS_CHAOS_CLUSTER_FAULTS, 30)
	@source hack/lib.sh && use_node_kind agent
	@NODE_KIND=agent NODES=$(E2E_NODES) hack/cluster-up.sh
	@source hack/lib.sh && stop_demo_operator
	NOOPS_CHAOS_NODE_KILLS=$${NOOPS_CHAOS_NODE_KILLS:-200} cargo test -p noops-e2e --quiet --test node_faults \
	  -- --ignored --test-threads=1 --nocapture repeated_node_kills
	NOOPS_CHAOS_ETCD_FAULTS=$${NOOPS_CHAOS_ETCD_FAULTS:-200} \
	  NOOPS_CHAOS_ETCD_MAJORITY_FAULTS=$${NOOPS_CHAOS_ETCD_MAJORITY_FAULTS:-60} \
	  cargo test -p noops-e2e --quiet --test etcd_chaos -- --nocapture
	NOOPS_CHAOS_PG_FAULTS=$${NOOPS_CHAOS_PG_FAULTS:-200} cargo test -p noops-e2e --quiet --test postgres_chaos \
	  -- --nocapture
	NOOPS_CHAOS_PG_HA_FAULTS=$${NOOPS_CHAOS_PG_HA_FAULTS:-500} cargo test -p noops-e2e --quiet --test node_faults \
	  -- --ignored --test-threads=1 --nocapture repeated_primary_faults
	NOOPS_CHAOS_CLUSTER_FAULTS=$${NOOPS_CHAOS_CLUSTER_FAULTS:-30} cargo test -p noops-e2e --quiet --test node_faults \
	  -- --ignored --test-threads=1 --nocapture a_cluster_keeps_every_tenant_object

test: setup lint feature-drift unit e2e ## Everything: setup, lint, one build of each dependency, unit tests, cluster, end-to-end tests

crds: ## Regenerate deploy/crds from the Rust types (CI fails if they drift)
	cargo run --quiet -p noops -- crds > deploy/crds/noops.dev.yaml
	cp deploy/crds/noops.dev.yaml charts/noops/crds/noops.dev.yaml

run: cluster-up ## Run the operator out of cluster against the local Kubernetes (Ctrl-C stops it)
	.noops/bin/kubectl apply --server-side -f deploy/crds/
	cargo run -p noops -- run --leader-elect=false

bench: setup ## Benchmarks, printed as a table (history in .noops/bench/results.md)
	@hack/bench.sh
