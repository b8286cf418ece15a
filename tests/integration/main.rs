//! Integration tests: the real ptraind against a real systemd, journald and
//! system D-Bus booted per test by the project's harness. Needs root.

mod daemon;
mod harness;

mod accounting;
mod bench_smoke;
mod brokers;
mod chains;
mod check_config;
mod cli_promises;
mod durability;
mod examples;
mod foundation;
mod gpus;
mod hostile;
mod image_cache;
mod image_hostile;
mod image_jobs;
mod images;
mod lifecycle;
mod limits;
mod logs;
mod notifications;
mod nvml;
mod package;
mod rabbit;
mod slurm;
mod tansu;
mod test_server;
