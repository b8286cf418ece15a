//! Link-time settings of the binaries.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let gnu_linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if gnu_linux {
        // ptraind is a PIE: its ~18,000 relative relocations (`readelf -r`)
        // as RELA entries are a 455 KiB table the loader reads whole at
        // every start and that then stays resident, 2% of the daemon's
        // 20 MiB idle RSS target (`make bench-ci`). Packed (DT_RELR, glibc
        // 2.36 and binutils 2.38, Debian 12's) they take a few KiB; the
        // binary stays position-independent.
        println!("cargo:rustc-link-arg-bin=ptraind=-Wl,-z,pack-relative-relocs");
    }
}
