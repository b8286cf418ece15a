# ptrain: build, test, demo and install.
#   make build                  release binaries in target/release
#   make test                   formatting, lints, unit and integration tests
#                               (the integration tests boot real systemd
#                               instances, tests/harness/boot.sh: run as root)
#   make demo                   packaging/demo.sh: set up and run one example job
#   make gpu-check              packaging/gpu-check.sh: NVML inventory and a real
#                               allocation on this machine's NVIDIA GPUs (exits 0
#                               with a message where there is no driver)
#   make install DESTDIR=/stage install the built binaries, units and config
#   make clean

CARGO   ?= cargo
INSTALL ?= install
DESTDIR ?=

.PHONY: all build test demo gpu-check install clean

all: build

build:
	$(CARGO) build --release

test:
	@[ "$$(id -u)" = 0 ] || echo "make test: warning: not root; the integration tests need root" >&2
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) test -- --test-threads=2

demo:
	packaging/demo.sh

gpu-check:
	packaging/gpu-check.sh

# Installs what `make build` built; it does not build (often run as root).
install:
	@for b in ptraind ptrain; do \
	    [ -x target/release/$$b ] || { echo "make install: target/release/$$b is missing; run make build first" >&2; exit 1; }; \
	done
	$(INSTALL) -D -m 0755 target/release/ptraind $(DESTDIR)/usr/sbin/ptraind
	$(INSTALL) -D -m 0755 target/release/ptrain $(DESTDIR)/usr/bin/ptrain
	$(INSTALL) -d $(DESTDIR)/lib/systemd/system
	$(INSTALL) -m 0644 units/*.service units/*.slice $(DESTDIR)/lib/systemd/system/
	$(INSTALL) -d $(DESTDIR)/usr/share/dbus-1/system.d
	$(INSTALL) -m 0644 packaging/dbus/*.conf $(DESTDIR)/usr/share/dbus-1/system.d/
	$(INSTALL) -D -m 0644 packaging/tmpfiles.d/ptrain.conf $(DESTDIR)/usr/lib/tmpfiles.d/ptrain.conf
	@# the config is the admin's once installed: never overwrite it
	@if [ -e $(DESTDIR)/etc/ptrain/ptrain.toml ]; then \
	    echo "keeping existing $(DESTDIR)/etc/ptrain/ptrain.toml (new default: packaging/ptrain.toml)"; \
	else \
	    echo "$(INSTALL) -D -m 0600 packaging/ptrain.toml $(DESTDIR)/etc/ptrain/ptrain.toml"; \
	    $(INSTALL) -D -m 0600 packaging/ptrain.toml $(DESTDIR)/etc/ptrain/ptrain.toml; \
	fi

clean:
	$(CARGO) clean
