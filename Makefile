# orderpipe - local dev stack (Kafka KRaft, Apicurio Registry, MariaDB on 127.0.0.1).
# See dev/stack.sh for details; state lives in .stack/ (git-ignored).
REPO_ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
STACK := $(REPO_ROOT)/dev/stack.sh

# `make` alone lists the targets.
.DEFAULT_GOAL := help
.PHONY: help
help: ## this list: every target and what it does
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: deps dev-up dev-down dev-status

deps: ## apt packages, Kafka jars and the Apicurio tarball, each only if missing
	$(STACK) deps

dev-up: ## start Kafka, the schema registry and MariaDB (reuses running ones)
	$(STACK) up

dev-down: ## stop the services dev/stack.sh started
	$(STACK) down

dev-status: ## endpoints and whether they answer (exit 1 if any is down)
	$(STACK) status

# ----------------------------------------------------------------------------
# The two commands of the README, and benchmarks.
.PHONY: build-deps run test soak bench bench-produce bench-consume bench-dlq bench-relay bench-ordering bench-delivery bench-crash bench-cdc bench-cdc-snapshot bench-console bench-dlq-mark bench-dedup-upgrade cdc-vs-debezium heap-profile

build-deps: ## apt packages the build needs (bundled librdkafka: cmake, libcurl headers, ...)
	$(STACK) build-deps

# `demo`, the bench-* commands and `produce --count` are the test harness
# (cargo feature `harness`); the release image is built without it.
run: build-deps ## the pipeline on an embedded stack (mock Kafka, in-process registry): no servers
	cargo run --features harness --bin orderpipe -- --log-level off demo

test: ## install and start Kafka, Apicurio and MariaDB, run every test, stop what was started
	$(REPO_ROOT)/dev/test.sh

soak: ## the issues' full-size robustness runs (100k events, twenty kills; ~20 min), one at a time (ONLY=crash:: a subset)
	$(REPO_ROOT)/dev/soak.sh

.PHONY: image
image: ## the Dockerfile's image without a daemon (buildah, mmdebstrap base), run as UID 10001 against the dev stack
	$(STACK) up
	$(REPO_ROOT)/dev/image.sh

bench: build-deps ## every benchmark below with its peers in one run; report in target/bench/report.md (SCALE=0.1: a tenth of the sizes)
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-all.sh

bench-produce: build-deps ## orderpipe produce vs kafka-producer-perf-test, 1M records, same broker
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-produce.sh $(or $(COUNT),1000000)

bench-consume: build-deps ## 1M backlog: perf-test vs orderpipe consume vs naive per-record consumer
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-consume.sh $(or $(COUNT),1000000) $(or $(NAIVE),50000)

bench-dlq: build-deps ## error tier: happy-path overhead and replay throughput (100k dead letters)
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-dlq.sh $(or $(COUNT),100000)

bench-relay: build-deps ## relay throughput per batch size, vs the plain producer, and API-to-apply latency
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-relay.sh $(or $(ROWS),100000) $(or $(RATE),100)

bench-ordering: build-deps ## per-key ordering: mode key vs none at 0/1/5 % failing events, DB statements per event
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-ordering.sh $(or $(COUNT),100000)

bench-delivery: build-deps ## HTTP delivery: in_flight 16 vs 1 per partition against an endpoint answering after 50 ms, per-key order checked at the endpoint
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-delivery.sh $(or $(COUNT),12000) $(or $(DELAY_MS),50)

bench-crash: build-deps ## crash safety at 1M: two members SIGKILLed 20 times, every event applied once, in order per order
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-crash.sh $(or $(COUNT),1000000) $(or $(KILLS),20)

bench-cdc: build-deps ## binlog source: catch-up rows/s vs the DB's insert rate and vs Debezium, commit-to-consumer lag p50/p99
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-cdc.sh $(or $(ROWS),100000) $(or $(LAG_ROWS),2000)

bench-cdc-snapshot: build-deps ## incremental snapshots: cdc's and Debezium's rows/s on the same table, and the stream's lag while each runs
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-cdc-snapshot.sh $(or $(ROWS),200000) $(or $(LAG_ROWS),1000)

cdc-vs-debezium: build-deps ## orderpipe cdc (json, avro) vs Debezium's MariaDB connector, every column of tests/fixtures/cdc_types.sql against MariaDB's own values (debug build; ORDERPIPE_BIN= another)
	cargo build --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/cdc-vs-debezium.sh

bench-dlq-mark: build-deps ## dlq replay's mark before and after migration 0028 (µs per row), and 0028's seconds per million over ROWS (default 1M) dead letters
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-dlq-mark.sh $(or $(ROWS),1000000)

bench-dedup-upgrade: build-deps ## the upgrade to compact dedup rows: migrate 0021 and `dedup upgrade` over ROWS (default 10M) rows of the earlier schema, seconds per million
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-dedup-upgrade.sh $(or $(ROWS),10000000)

heap-profile: build-deps ## a consumer's memory and allocations: `consume` under heaptrack over COUNT (default 300k), the sites that hold most at the peak and those called most per event
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/heap-profile.sh $(or $(COUNT),300000)

bench-console: build-deps ## console: page render times with 100k dead letters (12 partitions x 5 groups), bulk replay console vs CLI
	cargo build --release --features harness --bin orderpipe
	$(STACK) up
	$(REPO_ROOT)/dev/bench-console.sh $(or $(DEAD),100000) $(or $(REPLAY),20000) $(or $(RUNS),10) $(or $(PAIRS),5)
