use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::hooks::{ld_library_path, soname_links};
use super::load::{load_registry, read_dir_specs, Trust};
use super::spec::{check_device_name, check_kind, parse, Format};
use super::*;
use crate::store::AssignedGpu;

/// Like `nvidia-ctk cdi generate` on a two-GPU host: spec-level control
/// nodes, driver mounts, hooks and a variable; per-device nodes and the
/// /dev/dri links of each GPU.
const NVIDIA_YAML: &str = r#"---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidia-modeset
  - path: /dev/nvidia-uvm
  - path: /dev/nvidia-uvm-tools
  - path: /dev/nvidiactl
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - args:
    - nvidia-ctk
    - hook
    - create-symlinks
    - --link
    - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
    hookName: createContainer
    path: /usr/bin/nvidia-ctk
  - args:
    - nvidia-ctk
    - hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
    hookName: createContainer
    path: /usr/bin/nvidia-ctk
  mounts:
  - containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - nosuid
    - nodev
    - bind
  - containerPath: /usr/bin/nvidia-smi
    hostPath: /usr/bin/nvidia-smi
    options: [ro, nosuid, nodev, bind]
  - containerPath: /run/nvidia-persistenced/socket
    hostPath: /run/nvidia-persistenced/socket
    options: [ro, nosuid, nodev, bind, noexec]
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/dri/card1
    - path: /dev/dri/renderD128
    hooks:
    - args:
      - nvidia-ctk
      - hook
      - create-symlinks
      - --link
      - ../card1::/dev/dri/by-path/pci-0000:3b:00.0-card
      - --link
      - ../renderD128::/dev/dri/by-path/pci-0000:3b:00.0-render
      hookName: createContainer
      path: /usr/bin/nvidia-ctk
    - args: [nvidia-ctk, hook, chmod, --mode, "755", --path, /dev/dri]
      hookName: createContainer
      path: /usr/bin/nvidia-ctk
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/dri/card1
    - path: /dev/dri/renderD128
  name: GPU-aaaaaaaa-0000-0000-0000-000000000000
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
    - path: /dev/dri/card2
    - path: /dev/dri/renderD129
  name: "1"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
    - path: /dev/dri/card2
    - path: /dev/dri/renderD129
  name: GPU-bbbbbbbb-1111-1111-1111-111111111111
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    - path: /dev/nvidia1
  name: all
kind: nvidia.com/gpu
"#;

const GPU1_UUID: &str = "GPU-bbbbbbbb-1111-1111-1111-111111111111";

fn gpu(index: u32, uuid: &str) -> AssignedGpu {
    AssignedGpu {
        index,
        uuid: uuid.into(),
        device: format!("/dev/nvidia{index}").into(),
    }
}

fn nvidia_spec() -> Spec {
    parse(Path::new("/etc/cdi/nvidia.yaml"), NVIDIA_YAML.as_bytes()).unwrap()
}

fn registry_of(specs: Vec<(usize, Spec)>) -> Registry {
    Registry::new(vec!["/etc/cdi".into(), "/var/run/cdi".into()], specs)
}

fn problem(e: CdiError) -> String {
    match e {
        CdiError::Invalid { problem, .. } => problem,
        other => panic!("not Invalid: {other}"),
    }
}

#[test]
fn an_nvidia_ctk_yaml_spec_parses_with_its_shared_and_per_device_edits() {
    let spec = nvidia_spec();
    assert_eq!(spec.version, "0.5.0");
    assert_eq!(spec.kind, "nvidia.com/gpu");
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "0",
            "GPU-aaaaaaaa-0000-0000-0000-000000000000",
            "1",
            GPU1_UUID,
            "all"
        ]
    );
    assert_eq!(spec.edits.device_nodes.len(), 4);
    assert_eq!(spec.edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert_eq!(spec.edits.hooks.len(), 2);
    assert_eq!(
        spec.edits.mounts[0].options,
        ["ro", "nosuid", "nodev", "bind"]
    );
    let gpu1 = spec.device("1").unwrap();
    assert_eq!(gpu1.container_edits.device_nodes[0].path, "/dev/nvidia1");
}

#[test]
fn the_json_form_parses_the_same() {
    let json = r#"{
      "cdiVersion": "0.8.0",
      "kind": "nvidia.com/gpu",
      "devices": [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "permissions": "rw"}]}}
      ],
      "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "mounts": [{"hostPath": "/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi", "options": ["ro", "bind"]}]
      }
    }"#;
    let spec = parse(Path::new("/var/run/cdi/nvidia.json"), json.as_bytes()).unwrap();
    assert_eq!(spec.version, "0.8.0");
    let node = &spec.device("0").unwrap().container_edits.device_nodes[0];
    assert_eq!((node.major, node.minor), (Some(195), Some(0)));
    assert_eq!(node.permissions.as_deref(), Some("rw"));
    assert_eq!(spec.edits.mounts[0].host_path, "/usr/bin/nvidia-smi");
}

#[test]
fn the_fake_gpu_fixture_is_a_valid_spec_for_two_gpus() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cdi/fake-gpu.yaml");
    let spec = parse(&path, &std::fs::read(&path).unwrap()).unwrap();
    let registry = registry_of(vec![(0, spec)]);
    let fake = |index: u32, uuid: &str| AssignedGpu {
        index,
        uuid: uuid.into(),
        device: format!("/dev/ptrain-fake-gpu{index}").into(),
    };
    let edits = registry
        .edits_for_gpus(&[fake(1, "GPU-11111111-1111-1111-1111-111111111111")])
        .unwrap();
    let devices = translate(&edits).unwrap();
    assert_eq!(
        devices.device_allow,
        [
            ("/dev/ptrain-fake-gpuctl".to_string(), "rw".to_string()),
            ("/dev/ptrain-fake-gpu1".to_string(), "rw".to_string()),
        ]
    );
    assert_eq!(devices.binds.len(), 2);
    assert!(devices
        .binds
        .iter()
        .all(|b| b.source.starts_with("/usr/lib/ptrain-fake-driver")));
    assert_eq!(
        devices.library_dirs,
        [PathBuf::from("/usr/lib/ptrain-fake-driver")]
    );
    assert_eq!(devices.symlinks.len(), 1);
}

#[test]
fn a_version_ptrain_does_not_read_is_refused_with_the_versions_it_does() {
    for version in ["0.2.0", "0.9.0", "1.0", ""] {
        let text = NVIDIA_YAML.replace("cdiVersion: 0.5.0", &format!("cdiVersion: \"{version}\""));
        let e = parse(Path::new("/etc/cdi/nvidia.yaml"), text.as_bytes()).unwrap_err();
        let shown = e.to_string();
        assert!(shown.contains("/etc/cdi/nvidia.yaml"), "{shown}");
        assert!(shown.contains("0.3.0, 0.4.0"), "{shown}");
        assert!(shown.contains("nvidia-ctk cdi generate"), "{shown}");
    }
}

#[test]
fn a_kind_that_is_not_vendor_slash_class_is_refused() {
    for kind in [
        "nvidia",
        "nvidia.com/gpu/x",
        "nvidia.com/",
        "/gpu",
        "-bad.com/gpu",
        "nvidia.com/-gpu",
        "a b.com/gpu",
    ] {
        assert!(check_kind(kind).is_err(), "{kind}");
    }
    for kind in [
        "nvidia.com/gpu",
        "vendor.com/foo",
        "foo.bar.baz/foo-bar123.B_az",
    ] {
        assert_eq!(check_kind(kind), Ok(()), "{kind}");
    }
    let text = NVIDIA_YAML.replace("kind: nvidia.com/gpu", "kind: nvidia");
    let shown = parse(Path::new("/etc/cdi/x.yaml"), text.as_bytes())
        .unwrap_err()
        .to_string();
    assert!(
        shown.contains("/etc/cdi/x.yaml") && shown.contains("vendor/class"),
        "{shown}"
    );
}

#[test]
fn device_names_follow_the_cdi_rule_and_appear_once() {
    for name in ["0", "all", GPU1_UUID, "0:1", "mig-1g.5gb"] {
        assert_eq!(check_device_name(name), Ok(()), "{name}");
    }
    for name in ["", "-0", "0-", "a/b", "a b", "é"] {
        assert!(check_device_name(name).is_err(), "{name:?}");
    }
    let twice = NVIDIA_YAML.replace("name: all", "name: \"0\"");
    let why = problem(parse(Path::new("/etc/cdi/n.yaml"), twice.as_bytes()).unwrap_err());
    assert!(why.contains("listed twice"), "{why}");
}

#[test]
fn unknown_fields_and_unapplied_edits_are_refused_not_skipped() {
    let extra = NVIDIA_YAML.replace("  env:\n", "  futureEdit: true\n  env:\n");
    let e = parse(Path::new("/etc/cdi/n.yaml"), extra.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("futureEdit"), "{e}");
    let gids = NVIDIA_YAML.replace("  env:\n", "  additionalGids: [44]\n  env:\n");
    let why = problem(parse(Path::new("/etc/cdi/n.yaml"), gids.as_bytes()).unwrap_err());
    assert!(why.contains("additionalGids"), "{why}");
    let broken = parse(Path::new("/etc/cdi/n.yaml"), b"cdiVersion: [").unwrap_err();
    assert!(broken.to_string().contains("/etc/cdi/n.yaml"), "{broken}");
    assert_eq!(Format::of("nvidia.yaml"), Some(Format::Yaml));
    assert_eq!(Format::of("README"), None);
    assert_eq!(Format::of(".nvidia.yaml.tmp"), None);
}

#[test]
fn a_gpu_resolves_by_uuid_first_then_by_index() {
    let registry = registry_of(vec![(0, nvidia_spec())]);
    assert_eq!(
        registry.resolve_gpu(&gpu(1, GPU1_UUID)).unwrap(),
        format!("nvidia.com/gpu={GPU1_UUID}")
    );
    // A UUID the spec does not name: the index.
    assert_eq!(
        registry.resolve_gpu(&gpu(1, "GPU-unknown")).unwrap(),
        "nvidia.com/gpu=1"
    );
    // Neither: the error names the GPU and how to regenerate.
    let e = registry.resolve_gpu(&gpu(5, "GPU-unknown")).unwrap_err();
    assert!(matches!(e, CdiError::DeviceMissing { index: 5, .. }), "{e}");
    assert!(e.to_string().contains("nvidia-ctk cdi generate"), "{e}");
}

#[test]
fn a_spec_whose_index_gives_another_gpus_node_is_stale() {
    let registry = registry_of(vec![(0, nvidia_spec())]);
    // ptrain's GPU 1 is /dev/nvidia3 now; the spec's "1" still says nvidia1.
    let moved = AssignedGpu {
        device: "/dev/nvidia3".into(),
        ..gpu(1, "GPU-new")
    };
    let e = registry.resolve_gpu(&moved).unwrap_err();
    assert!(matches!(e, CdiError::WrongNode { .. }), "{e}");
}

#[test]
fn a_gpu_host_without_a_spec_is_told_how_to_generate_one() {
    let e = registry_of(vec![])
        .resolve_gpu(&gpu(0, "GPU-x"))
        .unwrap_err();
    assert!(matches!(e, CdiError::NoSpec { .. }));
    let shown = e.to_string();
    assert!(
        shown.contains("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml"),
        "{shown}"
    );
    assert!(shown.contains("/etc/cdi and /var/run/cdi"), "{shown}");
}

#[test]
fn gpu_1_alone_gets_its_node_and_the_shared_ones_never_gpu_0s() {
    let registry = registry_of(vec![(0, nvidia_spec())]);
    let edits = registry.edits_for_gpus(&[gpu(1, GPU1_UUID)]).unwrap();
    let devices = translate(&edits).unwrap();
    let allowed: Vec<&str> = devices
        .device_allow
        .iter()
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(
        allowed,
        [
            "/dev/nvidia-modeset",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidiactl",
            "/dev/nvidia1",
            "/dev/dri/card2",
            "/dev/dri/renderD129",
        ]
    );
    assert!(devices
        .device_allow
        .iter()
        .all(|(_, access)| access == "rw"));
    assert!(!allowed.contains(&"/dev/nvidia0"));
    assert_eq!(devices.environment, ["NVIDIA_VISIBLE_DEVICES=void"]);
    let binds: Vec<(String, String, bool, u64)> =
        devices.binds.iter().map(BindMount::dbus).collect();
    assert_eq!(
        binds[0],
        (
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15".into(),
            "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15".into(),
            false,
            0
        )
    );
    assert_eq!(binds.len(), 3);
    assert_eq!(devices.devices, [format!("nvidia.com/gpu={GPU1_UUID}")]);
    // GPU 0's by-path links and chmod are not GPU 1's (and under /dev).
    assert_eq!(
        devices.symlinks,
        [Symlink {
            link: "/usr/lib/x86_64-linux-gnu/libcuda.so".into(),
            target: "libcuda.so.1".into(),
        }]
    );
}

#[test]
fn two_gpus_share_the_specs_edits_once() {
    let registry = registry_of(vec![(0, nvidia_spec())]);
    let edits = registry
        .edits_for_gpus(&[
            gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000"),
            gpu(1, GPU1_UUID),
        ])
        .unwrap();
    assert_eq!(edits.env.len(), 1);
    assert_eq!(edits.mounts.len(), 3);
    // 4 control nodes, and 3 of each GPU.
    assert_eq!(edits.device_nodes.len(), 10);
    assert_eq!(edits.hooks.len(), 2);
}

#[test]
fn a_later_directory_overrides_a_device_and_one_directory_may_not_define_it_twice() {
    let mut late = nvidia_spec();
    late.path = "/var/run/cdi/nvidia.yaml".into();
    late.devices.retain(|d| d.name == "1");
    late.devices[0].container_edits.device_nodes[0].major = Some(195);
    late.devices[0].container_edits.device_nodes[0].minor = Some(1);
    let registry = registry_of(vec![(1, late), (0, nvidia_spec())]);
    let edits = registry.edits_for_gpus(&[gpu(1, "GPU-other")]).unwrap();
    assert_eq!(edits.devices, ["nvidia.com/gpu=1"]);
    let node = edits
        .device_nodes
        .iter()
        .find(|n| n.item.path == "/dev/nvidia1")
        .unwrap();
    assert_eq!(node.spec, Path::new("/var/run/cdi/nvidia.yaml"));
    assert_eq!(node.item.major, Some(195));

    let mut twin = nvidia_spec();
    twin.path = "/etc/cdi/nvidia-copy.yaml".into();
    let registry = registry_of(vec![(0, nvidia_spec()), (0, twin)]);
    let e = registry.resolve_gpu(&gpu(1, GPU1_UUID)).unwrap_err();
    assert!(matches!(e, CdiError::Conflict { .. }), "{e}");
    assert!(e.to_string().contains("nvidia-copy.yaml"), "{e}");
}

#[test]
fn specs_that_contradict_each_other_are_an_error_naming_both() {
    let mut other = parse(
        Path::new("/etc/cdi/other.yaml"),
        NVIDIA_YAML
            .replace("kind: nvidia.com/gpu", "kind: other.com/gpu")
            .replace("NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=all")
            .as_bytes(),
    )
    .unwrap();
    other.devices.truncate(1);
    let registry = registry_of(vec![(0, nvidia_spec()), (0, other)]);
    let e = registry
        .edits_for(&["nvidia.com/gpu=0".into(), "other.com/gpu=0".into()])
        .unwrap_err();
    let shown = e.to_string();
    assert!(shown.contains("NVIDIA_VISIBLE_DEVICES"), "{shown}");
    assert!(
        shown.contains("/etc/cdi/other.yaml") && shown.contains("/etc/cdi/nvidia.yaml"),
        "{shown}"
    );
}

fn edits_with(spec_text: &str) -> Result<JobDevices, CdiError> {
    let spec = parse(Path::new("/etc/cdi/t.yaml"), spec_text.as_bytes())?;
    let registry = registry_of(vec![(0, spec)]);
    translate(&registry.edits_for(&["nvidia.com/gpu=1".into()])?)
}

#[test]
fn the_hooks_become_symlinks_and_library_folders() {
    let devices = edits_with(NVIDIA_YAML).unwrap();
    assert_eq!(
        devices.library_dirs,
        [PathBuf::from("/usr/lib/x86_64-linux-gnu")]
    );
    assert_eq!(
        devices
            .ld_library_path(Some("/usr/local/cuda/lib64"))
            .as_deref(),
        Some("/usr/local/cuda/lib64:/usr/lib/x86_64-linux-gnu")
    );
    // GPU 0's /dev links: the host's /dev has them; nothing to make.
    let zero = parse(Path::new("/etc/cdi/t.yaml"), NVIDIA_YAML.as_bytes()).unwrap();
    let registry = registry_of(vec![(0, zero)]);
    let devices = translate(&registry.edits_for(&["nvidia.com/gpu=0".into()]).unwrap()).unwrap();
    assert!(devices.symlinks.iter().all(|l| !l.link.starts_with("/dev")));
    // The newer hook program reads the same.
    let newer = NVIDIA_YAML
        .replace(
            "path: /usr/bin/nvidia-ctk",
            "path: /usr/bin/nvidia-cdi-hook",
        )
        .replace("    - nvidia-ctk\n    - hook\n", "    - nvidia-cdi-hook\n");
    let devices = edits_with(&newer).unwrap();
    assert_eq!(
        devices.library_dirs,
        [PathBuf::from("/usr/lib/x86_64-linux-gnu")]
    );
    assert_eq!(devices.symlinks.len(), 1);
}

#[test]
fn an_unknown_hook_is_refused_naming_the_spec_and_the_hook() {
    let compat = NVIDIA_YAML.replace(
        "    - update-ldcache\n    - --folder\n    - /usr/lib/x86_64-linux-gnu\n",
        "    - enable-cuda-compat\n    - --host-driver-version=550.54.15\n",
    );
    let e = edits_with(&compat).unwrap_err();
    assert!(matches!(e, CdiError::Hook { .. }), "{e}");
    let shown = e.to_string();
    assert!(shown.contains("/etc/cdi/t.yaml"), "{shown}");
    assert!(shown.contains("enable-cuda-compat"), "{shown}");
    let foreign = NVIDIA_YAML.replace("path: /usr/bin/nvidia-ctk", "path: /opt/vendor/hook");
    assert!(matches!(
        edits_with(&foreign).unwrap_err(),
        CdiError::Hook { .. }
    ));
    let late = NVIDIA_YAML.replace("hookName: createContainer", "hookName: poststop");
    assert!(matches!(
        edits_with(&late).unwrap_err(),
        CdiError::Hook { .. }
    ));
    let flag = NVIDIA_YAML.replace("    - --folder\n", "    - --reload\n");
    assert!(matches!(
        edits_with(&flag).unwrap_err(),
        CdiError::Hook { .. }
    ));
    let chmod_outside = NVIDIA_YAML.replace(
        "    - update-ldcache\n    - --folder\n    - /usr/lib/x86_64-linux-gnu\n",
        "    - chmod\n    - --mode\n    - \"777\"\n    - --path\n    - /etc\n",
    );
    assert!(matches!(
        edits_with(&chmod_outside).unwrap_err(),
        CdiError::Hook { .. }
    ));
}

#[test]
fn edits_ptrain_cannot_apply_safely_are_refused() {
    let cases = [
        // A node at another path than the host's: a mount point in /dev.
        (
            "    - path: /dev/nvidia1\n",
            "    - path: /dev/nvidia1\n      hostPath: /dev/nvidia7\n",
            "at another path",
        ),
        // A mount onto the host's /proc.
        (
            "containerPath: /usr/bin/nvidia-smi",
            "containerPath: /proc/driver/x",
            "API file system",
        ),
        // A path systemd's unit syntax would misread.
        (
            "containerPath: /usr/bin/nvidia-smi",
            "containerPath: /usr/bin/nvidia%smi",
            "unit syntax",
        ),
        (
            "containerPath: /usr/bin/nvidia-smi",
            "containerPath: /usr/../etc/shadow",
            ".. component",
        ),
        (
            "hostPath: /usr/bin/nvidia-smi",
            "hostPath: usr/bin/nvidia-smi",
            "not an absolute path",
        ),
        (
            "options: [ro, nosuid, nodev, bind]",
            "options: [ro, bind, exec-as-root]",
            "exec-as-root",
        ),
        (
            "NVIDIA_VISIBLE_DEVICES=void",
            "CUDA_VISIBLE_DEVICES=0",
            "ptraind sets",
        ),
        (
            "NVIDIA_VISIBLE_DEVICES=void",
            "PTRAIN_JOB_ID=x",
            "ptraind sets",
        ),
        (
            "NVIDIA_VISIBLE_DEVICES=void",
            "NVIDIA_VISIBLE_DEVICES=$HOME",
            "%, $",
        ),
    ];
    for (from, to, why) in cases {
        let text = NVIDIA_YAML.replacen(from, to, 1);
        assert_ne!(text, NVIDIA_YAML, "{to}");
        let e = edits_with(&text).unwrap_err();
        let shown = e.to_string();
        assert!(
            shown.contains("/etc/cdi/t.yaml") && shown.contains(why),
            "{to}: {shown}"
        );
    }
    // Access is the spec's, less mknod.
    let read_only = NVIDIA_YAML.replacen(
        "    - path: /dev/nvidia1\n",
        "    - path: /dev/nvidia1\n      permissions: rm\n",
        1,
    );
    let devices = edits_with(&read_only).unwrap();
    assert!(devices
        .device_allow
        .contains(&("/dev/nvidia1".to_string(), "r".to_string())));
}

#[test]
fn ld_library_path_appends_each_folder_once_without_empty_entries() {
    let dirs = [
        PathBuf::from("/usr/lib/x86_64-linux-gnu"),
        PathBuf::from("/opt/drv"),
    ];
    assert_eq!(ld_library_path(None, &[]), None);
    assert_eq!(
        ld_library_path(Some(""), &dirs).as_deref(),
        Some("/usr/lib/x86_64-linux-gnu:/opt/drv")
    );
    assert_eq!(
        ld_library_path(Some(":/a::/opt/drv:"), &dirs).as_deref(),
        Some("/a:/opt/drv:/usr/lib/x86_64-linux-gnu")
    );
}

#[test]
fn soname_links_are_made_as_ldconfig_would() {
    let dir = PathBuf::from("/usr/lib/x86_64-linux-gnu");
    let files = vec![
        (
            dir.join("libcuda.so.550.54.15"),
            PathBuf::from("/host/libcuda.so.550.54.15"),
        ),
        (
            dir.join("libnvidia-ml.so.550.54.15"),
            PathBuf::from("/host/libnvidia-ml.so.550.54.15"),
        ),
        (
            PathBuf::from("/usr/bin/nvidia-smi"),
            PathBuf::from("/host/nvidia-smi"),
        ),
    ];
    let existing = vec![Symlink {
        link: dir.join("libnvidia-ml.so.1"),
        target: "libnvidia-ml.so.550.54.15".into(),
    }];
    let links = soname_links(&files, std::slice::from_ref(&dir), &existing, |host| {
        let name = host.file_name()?.to_str()?;
        Some(format!("{}.1", &name[..name.find(".so")? + 3]))
    });
    assert_eq!(
        links,
        [Symlink {
            link: dir.join("libcuda.so.1"),
            target: "libcuda.so.550.54.15".into(),
        }]
    );
}

#[test]
fn the_soname_of_a_real_library_is_read_from_its_headers() {
    assert_eq!(elf::soname(3, |_, _| Some(vec![0; 3])), None);
    let not_elf = vec![0u8; 4096];
    assert_eq!(
        elf::soname(not_elf.len() as u64, |o, n| not_elf
            .get(o as usize..o as usize + n)
            .map(<[u8]>::to_vec)),
        None
    );
    // The host's C library, where there is one.
    for libc in [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
    ] {
        if Path::new(libc).exists() {
            assert_eq!(
                load::read_soname(Path::new(libc)).as_deref(),
                Some("libc.so.6")
            );
        }
    }
}

/// A CDI directory made by the test, owned by the test's user.
fn cdi_dir(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn write_spec(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

fn me() -> Trust {
    // SAFETY: geteuid has no preconditions.
    Trust {
        owner: unsafe { libc::geteuid() },
    }
}

fn temp_root() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    root
}

#[test]
fn the_loader_reads_both_directories_the_later_overriding() {
    let root = temp_root();
    let etc = cdi_dir(root.path(), "etc-cdi");
    let run = cdi_dir(root.path(), "run-cdi");
    write_spec(&etc, "nvidia.yaml", NVIDIA_YAML);
    write_spec(&etc, "README", "not a spec");
    let late = NVIDIA_YAML.replace("NVIDIA_VISIBLE_DEVICES=void", "LATE=1");
    write_spec(&run, "nvidia.yaml", &late);
    let missing = root.path().join("absent");
    let registry = load_registry(&[etc.clone(), run.clone(), missing], me()).unwrap();
    assert_eq!(registry.specs().len(), 2);
    let edits = registry.edits_for_gpus(&[gpu(1, GPU1_UUID)]).unwrap();
    let env: Vec<&str> = edits.env.iter().map(|e| e.item.as_str()).collect();
    assert_eq!(env, ["LATE=1"]);
    assert!(edits.device_nodes.iter().all(|n| n.spec.starts_with(&run)));
}

#[test]
fn the_loader_refuses_a_world_writable_spec() {
    let root = temp_root();
    let etc = cdi_dir(root.path(), "cdi");
    let path = write_spec(&etc, "nvidia.yaml", NVIDIA_YAML);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let e = read_dir_specs(&etc, me()).unwrap_err();
    assert!(matches!(e, CdiError::Untrusted { .. }), "{e}");
    let shown = e.to_string();
    assert!(
        shown.contains(&path.display().to_string()) && shown.contains("writable by everyone"),
        "{shown}"
    );
    // A directory anyone can write is refused too.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        read_dir_specs(&etc, me()).unwrap_err(),
        CdiError::Untrusted { .. }
    ));
    // As is one owned by someone else.
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let stranger = Trust {
        owner: me().owner + 1,
    };
    assert!(matches!(
        read_dir_specs(&etc, stranger).unwrap_err(),
        CdiError::Untrusted { .. }
    ));
}

#[test]
fn the_loader_refuses_a_symlinked_spec_or_directory() {
    let root = temp_root();
    let elsewhere = cdi_dir(root.path(), "elsewhere");
    let target = write_spec(&elsewhere, "nvidia.yaml", NVIDIA_YAML);
    let etc = cdi_dir(root.path(), "cdi");
    std::os::unix::fs::symlink(&target, etc.join("nvidia.yaml")).unwrap();
    let e = read_dir_specs(&etc, me()).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    let linked_dir = root.path().join("cdi-link");
    std::os::unix::fs::symlink(&elsewhere, &linked_dir).unwrap();
    let e = read_dir_specs(&linked_dir, me()).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
}

#[test]
fn the_loader_refuses_an_oversized_spec_and_names_a_broken_one() {
    let root = temp_root();
    let etc = cdi_dir(root.path(), "cdi");
    let big = write_spec(&etc, "big.json", "");
    std::fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(load::MAX_SPEC_BYTES as u64 + 1)
        .unwrap();
    assert!(matches!(
        read_dir_specs(&etc, me()).unwrap_err(),
        CdiError::Untrusted { .. }
    ));
    std::fs::remove_file(&big).unwrap();
    let broken = write_spec(
        &etc,
        "broken.yaml",
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n",
    );
    let e = read_dir_specs(&etc, me()).unwrap_err();
    assert!(e.to_string().contains(&broken.display().to_string()), "{e}");
}

#[test]
fn verify_host_names_a_missing_driver_file_and_a_wrong_node() {
    let root = temp_root();
    let present = root.path().join("libcuda.so.1");
    std::fs::write(&present, b"").unwrap();
    let bind = |source: &Path| BindMount {
        spec: "/etc/cdi/nvidia.yaml".into(),
        source: source.to_path_buf(),
        destination: "/usr/lib/libcuda.so.1".into(),
        recursive: false,
    };
    let mut devices = JobDevices {
        binds: vec![bind(&present)],
        host_nodes: vec![HostNode {
            spec: "/etc/cdi/nvidia.yaml".into(),
            path: "/dev/null".into(),
            block: false,
            number: Some((1, 3)),
        }],
        ..JobDevices::default()
    };
    load::verify_host(&devices).unwrap();
    devices.binds.push(bind(&root.path().join("libgone.so")));
    let e = load::verify_host(&devices).unwrap_err();
    assert!(
        matches!(e, CdiError::HostPath { .. }) && e.to_string().contains("libgone.so"),
        "{e}"
    );
    devices.binds.pop();
    devices.host_nodes[0].number = Some((195, 0));
    let e = load::verify_host(&devices).unwrap_err();
    assert!(e.to_string().contains("1:3"), "{e}");
}

#[test]
fn a_symlink_onto_a_mount_point_is_refused() {
    let clash = NVIDIA_YAML.replace(
        "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so\n",
        "libcuda.so.1::/usr/bin/nvidia-smi\n",
    );
    let e = edits_with(&clash).unwrap_err();
    assert!(e.to_string().contains("also a mount point"), "{e}");
}

#[test]
fn job_devices_is_the_gpus_edits_translated() {
    let registry = registry_of(vec![(0, nvidia_spec())]);
    let devices = job_devices(
        &registry,
        &[gpu(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000")],
    )
    .unwrap();
    assert!(devices
        .device_allow
        .iter()
        .any(|(p, _)| p == "/dev/nvidia0"));
    assert!(!devices
        .device_allow
        .iter()
        .any(|(p, _)| p == "/dev/nvidia1"));
    assert_eq!(devices.mount_points().count(), 3);
}
