#!/bin/bash
# Installs (as root, from Debian's packages) or checks everything the tests
# need on a fresh Debian 12 machine, with a clear message where it cannot:
# `make test` runs it first, so `sudo make test` needs nothing else.
#   bash tests/install-deps.sh
set -euo pipefail

# systemd, dbus, util-linux: the integration tests boot real systemd
# instances (tests/harness/boot.sh); libsystemd0: ptraind reads the journal
# through it (systemd depends on it; named here because ptraind loads it
# itself); python3-aiosmtpd: the SMTP test server; passwd: useradd for test
# users; gcc, libc6-dev: the linker rustc calls, and the compiler that
# builds the fake NVML driver (tests/fake-nvml); python3: the spool
# examples; binutils, gzip, init-system-helpers: the Debian package test
# (strip, man pages, deb-systemd-helper), lintian: the package test fails
# on any lintian error or warning; shellcheck: the GPU script's test
# (packaging/gpu-e2e.sh runs as root on a GPU host) lints it;
# docker-registry, skopeo, umoci, busybox-static: the container image test
# (tests/integration/images.rs) builds a real image with umoci from the
# static busybox (it runs chrooted in the unpacked tree), pushes it with
# skopeo to a real registry on loopback and writes its archives;
# apache2-utils: htpasswd, for a registry that asks for credentials;
# rabbitmq-server: the AMQP broker the event-stream test
# (tests/integration/brokers.rs) starts on loopback ports of its own;
# slurm-wlm, munge, iproute2: the Slurm cluster of the Slurm test
# (tests/harness/slurm/boot.sh: a controller and two nodes in network
# namespaces of their own; tests/integration/slurm.rs).
PKGS=(systemd libsystemd0 dbus util-linux python3 python3-aiosmtpd passwd make gcc libc6-dev binutils gzip init-system-helpers lintian shellcheck docker-registry skopeo umoci busybox-static apache2-utils rabbitmq-server slurm-wlm munge iproute2)

die() { echo "tests/install-deps.sh: $*" >&2; exit 1; }

missing=()
for p in "${PKGS[@]}"; do
    if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "test packages: all installed"
else
    echo "test packages missing: ${missing[*]}"
    [ "$(id -u)" = 0 ] || die "run as root (sudo make test) to install them, or: apt-get install ${missing[*]}"
    command -v apt-get >/dev/null || die "no apt-get; install these packages by hand: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update </dev/null
    apt-get install -y --no-install-recommends "${missing[@]}" </dev/null
fi

[ "$(id -u)" = 0 ] || echo "tests/install-deps.sh: warning: not root; the integration tests need root (they boot systemd)" >&2
if ! command -v cargo >/dev/null && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || die "cargo not found; install a Rust toolchain (https://rustup.rs, or apt-get install cargo)"
need_component() {   # COMPONENT CARGO-SUBCOMMAND
    cargo "$2" --version >/dev/null 2>&1 && return
    command -v rustup >/dev/null || die "cargo $2 is missing and there is no rustup to add $1"
    rustup component add "$1" </dev/null
}
need_component rustfmt fmt
need_component clippy clippy

# tansu: the Kafka-protocol broker of the event-stream test
# (tests/integration/brokers.rs, tests/integration/tansu.rs). Debian has no
# Kafka; tansu is on crates.io, built here once, pinned (its own lock file),
# with its SQLite engine, so what it acknowledged survives its restart as
# with Apache Kafka. A debug build: it compiles in about half the time of a
# release one, and a test broker needs no speed.
TANSU_VERSION=0.6.0
TANSU_ROOT=/opt/ptrain-tests
if [ "$("$TANSU_ROOT/bin/tansu" --version 2>/dev/null)" != "tansu $TANSU_VERSION" ]; then
    [ "$(id -u)" = 0 ] || die "run as root (sudo make test) to build the test broker, or: cargo install tansu --version $TANSU_VERSION --locked --features libsql --debug --root $TANSU_ROOT"
    echo "building the test Kafka broker (tansu $TANSU_VERSION; several minutes, once)"
    cargo install tansu --version "$TANSU_VERSION" --locked --features libsql --debug \
        --root "$TANSU_ROOT" --target-dir "$TANSU_ROOT/build" </dev/null
    rm -rf "$TANSU_ROOT/build"
fi
