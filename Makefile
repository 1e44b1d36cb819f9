# noops: Kubernetes operators in Rust, and the local Kubernetes they are shown on.
# `make demo` and `make test` each set up everything they need on a fresh machine.
SHELL := /bin/bash
.DEFAULT_GOAL := help
export KUBECONFIG := $(CURDIR)/.noops/kubeconfig

.PHONY: help setup cluster-up cluster-down demo test unit e2e lint bench crds run

help: ## Show the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-z0-9-]+:.*## / { printf "  make %-14s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

setup: ## Install packages, build upstream binaries (cached) and the Rust workspace
	@hack/setup.sh

cluster-up: setup ## Start the local Kubernetes (prints how long it took)
	@hack/cluster-up.sh

cluster-down: ## Stop the local Kubernetes and remove its state (logs stay in .noops/logs)
	@hack/cluster-down.sh

demo: cluster-up ## Bring the local Kubernetes up and show a workload running on it
	@hack/demo.sh

lint: ## cargo fmt --check and clippy with warnings as errors
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --quiet -- -D warnings

unit: ## Unit tests (no cluster)
	cargo test --workspace --quiet --lib --bins

e2e: cluster-up ## End-to-end tests against the local Kubernetes
	@source hack/lib.sh && stop_demo_operator
	cargo test -p noops-e2e -p noops-sample-operator --quiet --test '*' -- --test-threads=4

test: setup lint unit e2e ## Everything: setup, lint, unit tests, cluster, end-to-end tests

crds: ## Regenerate deploy/crds from the Rust types (CI fails if they drift)
	cargo run --quiet -p noops -- crds > deploy/crds/noops.dev.yaml
	cp deploy/crds/noops.dev.yaml charts/noops/crds/noops.dev.yaml

run: cluster-up ## Run the operator out of cluster against the local Kubernetes (Ctrl-C stops it)
	.noops/bin/kubectl apply --server-side -f deploy/crds/
	cargo run -p noops -- run --leader-elect=false

bench: setup ## Benchmarks, printed as a table (history in .noops/bench/results.md)
	@hack/bench.sh
