# ptrain: build, test, demo and install.
#   make build                  release binaries in target/release
#   make test                   installs what the tests need (tests/install-deps.sh),
#                               then formatting, lints, unit and integration tests
#                               (the integration tests boot real systemd
#                               instances, tests/harness/boot.sh: run as root)
#   make demo                   packaging/demo.sh: set up and run one example job
#   make gpu-check              packaging/gpu-check.sh: NVML inventory and a real
#                               allocation on this machine's NVIDIA GPUs (exits 0
#                               with a message where there is no driver)
#   make gpu-e2e                packaging/gpu-e2e.sh (root): on a machine with an NVIDIA
#                               GPU, ptraind with backend = "nvml" in the systemd
#                               harness runs a real PyTorch job as an unprivileged
#                               user, checks CUDA and NVML see what ptraind assigned,
#                               prints a report (within 8 minutes; exits 0 with a
#                               message where there is no driver; GPU_E2E_FAKE=1: the
#                               tests' fake driver, no PyTorch)
#   make docs                   man pages and bash/zsh/fish completions, generated
#                               from the built binaries (BINDIR) into GENDIR
#   make deb                    build, then the Debian package in target/debian/
#                               (packaging/build-deb.sh; any BINDIR: build-deb.sh BINDIR)
#   make install DESTDIR=/stage install the built binaries, units, config, man
#                               pages, completions and docs (BINDIR, GENDIR, and
#                               UNITDIR, MANDIR, *COMPDIR, DOCDIR for other layouts)
#   make bench [BENCH_SCALE=ci] benchmarks against a real systemd harness (root):
#                               one table, each figure beside its floor, and
#                               target/bench/results.json (full: the issue's
#                               sizes, tens of minutes; ci: about 10 minutes,
#                               plus the release build)
#   make bench-ci               the ci scale with its enforced limits
#                               (BENCH_ENFORCE=1): fails when CPU per job grows
#                               with history, `ptrain status` slows with it, idle
#                               RSS (also after `ptrain list --all`) tops 20 MiB, or
#                               idle ptraind wakes up, or a 500-job burst costs a
#                               restart or systemd's bus; .ci/run runs it (the
#                               10,000-job burst: make bench, or BENCH_ONLY=burst
#                               BENCH_SIZES=10000)
#   make clean

CARGO   ?= cargo
INSTALL ?= install
DESTDIR ?=
# Where install and docs take the built binaries and the generated pages from.
BINDIR  ?= target/release
GENDIR  ?= $(BINDIR)/generated
DEBDIR  ?= target/debian
UNITDIR ?= /lib/systemd/system
MANDIR  ?= /usr/share/man
BASHCOMPDIR ?= /usr/share/bash-completion/completions
ZSHCOMPDIR  ?= /usr/share/zsh/vendor-completions
FISHCOMPDIR ?= /usr/share/fish/vendor_completions.d
DOCDIR  ?= /usr/share/doc/ptrain
# Man page dates from the last commit, so that rebuilds are identical.
# Given only to the page generator and the packager: exported to cargo, it
# would make the next plain `cargo build` rebuild ring, rustls and friends.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null)

.PHONY: all build docs deb test demo gpu-check gpu-e2e install clean bench bench-ci

all: build

build:
	$(CARGO) build --release
	$(MAKE) --no-print-directory docs BINDIR=target/release GENDIR=target/release/generated

# Man pages and completions come from the binaries' own clap definitions
# (hidden `generate` subcommands), so they always match --help.
docs:
	@for b in ptraind ptrain; do \
	    [ -x $(BINDIR)/$$b ] || { echo "make docs: $(BINDIR)/$$b is missing; run make build first" >&2; exit 1; }; \
	done
	rm -rf $(GENDIR)/man $(GENDIR)/completions
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BINDIR)/ptrain generate --man $(GENDIR)/man --completions $(GENDIR)/completions >/dev/null
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) $(BINDIR)/ptraind generate --man $(GENDIR)/man >/dev/null

deb: build
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) packaging/build-deb.sh target/release $(DEBDIR)

test:
	bash tests/install-deps.sh
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
	$(CARGO) test -- --test-threads=2
	@# The package test changes the host that every harness shares: alone, last.
	$(CARGO) test --test integration -- --ignored --test-threads=1

demo:
	packaging/demo.sh

BENCH_SCALE ?= full
bench:
	@[ "$$(id -u)" = 0 ] || { echo "make bench: must run as root: it boots a real systemd (tests/harness/boot.sh)" >&2; exit 1; }
	BENCH_SCALE=$(BENCH_SCALE) $(CARGO) bench --bench ptrain

# Wall-clock latency and throughput are reported, not enforced: shared CI
# machines are too noisy for them (benches/ptrain/suite.rs).
bench-ci:
	@[ "$$(id -u)" = 0 ] || { echo "make bench-ci: must run as root: it boots a real systemd (tests/harness/boot.sh)" >&2; exit 1; }
	BENCH_SCALE=ci BENCH_ENFORCE=1 $(CARGO) bench --bench ptrain

gpu-check:
	packaging/gpu-check.sh

gpu-e2e:
	packaging/gpu-e2e.sh

# Installs what `make build` built; it does not build (often run as root),
# only regenerates the man pages and completions from the binaries.
install: docs
	@for b in ptraind ptrain; do \
	    [ -x $(BINDIR)/$$b ] || { echo "make install: $(BINDIR)/$$b is missing; run make build first" >&2; exit 1; }; \
	done
	$(INSTALL) -D -s -m 0755 $(BINDIR)/ptraind $(DESTDIR)/usr/sbin/ptraind
	$(INSTALL) -D -s -m 0755 $(BINDIR)/ptrain $(DESTDIR)/usr/bin/ptrain
	$(INSTALL) -d $(DESTDIR)$(UNITDIR)
	$(INSTALL) -m 0644 units/*.service units/*.slice $(DESTDIR)$(UNITDIR)/
	$(INSTALL) -d $(DESTDIR)/usr/share/dbus-1/system.d
	$(INSTALL) -m 0644 packaging/dbus/*.conf $(DESTDIR)/usr/share/dbus-1/system.d/
	$(INSTALL) -D -m 0644 packaging/tmpfiles.d/ptrain.conf $(DESTDIR)/usr/lib/tmpfiles.d/ptrain.conf
	$(INSTALL) -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5 $(DESTDIR)$(MANDIR)/man8
	@# gzip -n: no name or time stamp inside, so rebuilds are identical
	for page in $(GENDIR)/man/*.[158]; do \
	    dest=$(DESTDIR)$(MANDIR)/man$${page##*.}/$${page##*/}.gz; \
	    gzip -9n -c $$page > $$dest && chmod 0644 $$dest || exit 1; \
	done
	$(INSTALL) -D -m 0644 $(GENDIR)/completions/ptrain.bash $(DESTDIR)$(BASHCOMPDIR)/ptrain
	$(INSTALL) -D -m 0644 $(GENDIR)/completions/_ptrain $(DESTDIR)$(ZSHCOMPDIR)/_ptrain
	$(INSTALL) -D -m 0644 $(GENDIR)/completions/ptrain.fish $(DESTDIR)$(FISHCOMPDIR)/ptrain.fish
	$(INSTALL) -D -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md
	$(INSTALL) -D -m 0644 packaging/grafana-dashboard.json $(DESTDIR)$(DOCDIR)/grafana-dashboard.json
	$(INSTALL) -D -m 0644 packaging/schema/ptrain-cloudevent.schema.json $(DESTDIR)$(DOCDIR)/ptrain-cloudevent.schema.json
	$(INSTALL) -d $(DESTDIR)$(DOCDIR)/examples/pipeline
	$(INSTALL) -m 0644 spool-examples/*.json spool-examples/README.md $(DESTDIR)$(DOCDIR)/examples/
	$(INSTALL) -m 0644 spool-examples/pipeline/*.json $(DESTDIR)$(DOCDIR)/examples/pipeline/
	@# the config is the admin's once installed: never overwrite it
	@if [ -e $(DESTDIR)/etc/ptrain/ptrain.toml ]; then \
	    echo "keeping existing $(DESTDIR)/etc/ptrain/ptrain.toml (new default: packaging/ptrain.toml)"; \
	else \
	    echo "$(INSTALL) -D -m 0600 packaging/ptrain.toml $(DESTDIR)/etc/ptrain/ptrain.toml"; \
	    $(INSTALL) -D -m 0600 packaging/ptrain.toml $(DESTDIR)/etc/ptrain/ptrain.toml; \
	fi

clean:
	$(CARGO) clean
