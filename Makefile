# orderpipe - local dev stack (Kafka KRaft, Apicurio Registry, MariaDB on 127.0.0.1).
# See dev/stack.sh for details; state lives in .stack/ (git-ignored).
REPO_ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
STACK := $(REPO_ROOT)/dev/stack.sh

.PHONY: deps dev-up dev-down dev-status

deps: ## apt packages, Kafka jars and the Apicurio tarball, each only if missing
	$(STACK) deps

dev-up: ## start Kafka, the schema registry and MariaDB (reuses running ones)
	$(STACK) up

dev-down: ## stop the services dev/stack.sh started
	$(STACK) down

dev-status: ## endpoints and whether they answer (exit 1 if any is down)
	$(STACK) status
