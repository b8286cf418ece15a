//! `ptrain gpus`: the GPU inventory, each GPU's state and holder.

use ptrain::display::escape;
use ptrain::views::GpusView;

use crate::human::{human_mib, truncate};
use crate::{from_bus, parse, print_json, proxy, Failure};

/// `ptrain gpus`: each GPU, its state and the job holding it.
pub(crate) async fn gpus(json: bool) -> Result<u8, Failure> {
    let view: GpusView = parse(&proxy().await?.gpus().await.map_err(from_bus)?)?;
    if json {
        print_json(&view);
    } else {
        outln!("backend: {}", view.backend);
        outln!(
            "{:<5} {:<24} {:>9} {:>9} {:<12} {:<16} UUID",
            "INDEX",
            "NAME",
            "MEMORY",
            "USED",
            "STATE",
            "JOB"
        );
        for g in &view.gpus {
            outln!(
                "{:<5} {:<24} {:>9} {:>9} {:<12} {:<16} {}",
                g.gpu.index,
                truncate(&g.gpu.name, 24),
                human_mib(g.gpu.memory_total_mib),
                g.gpu.memory_used_mib.map(human_mib).unwrap_or("-".into()),
                if g.state.is_empty() { "-" } else { &g.state },
                g.held_by
                    .as_deref()
                    .or(g.reserved_for.as_deref())
                    .unwrap_or("-"),
                g.gpu.uuid
            );
        }
        // What the STATE column cannot hold: why a GPU is out.
        for g in &view.gpus {
            if matches!(g.state.as_str(), "unhealthy" | "busy-foreign") {
                outln!("GPU {}: {}", g.gpu.index, escape(&g.detail));
            }
        }
    }
    Ok(0)
}
