//! Integration tests: the real ptraind against a real systemd, journald and
//! system D-Bus booted per test by the project's harness. Needs root.

mod daemon;
mod harness;

mod durability;
mod foundation;
mod limits;
mod hostile;
