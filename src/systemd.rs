//! The systemd edge: starting job units over D-Bus, reading how they ended,
//! and one stream of signals that says when to look.
//!
//! Facts this relies on (see tests/harness and the systemd D-Bus API):
//! - `Subscribe()` from a connection that stays up, or no unit signals are
//!   broadcast.
//! - A unit started with `AddRef=true` stays loaded after it ends while our
//!   reference lives, so its Result and exit status can be read; `Unref`
//!   then lets `CollectMode=inactive-or-failed` collect it.
//! - The first PropertiesChanged of a new unit may already say
//!   inactive/dead: a unit has ended only when it is inactive or failed AND
//!   has no pending job.

use std::collections::HashMap;

use futures_util::StreamExt;
use zbus::{Connection, OwnedObjectPath, OwnedVariant};
use zbus_systemd::systemd1::ManagerProxy;

pub use crate::unit::UnitState;
use crate::unit::{PropValue, UnitProperties};

const SYSTEMD: &str = "org.freedesktop.systemd1";
const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";
const UNIT_PATH_PREFIX: &str = "/org/freedesktop/systemd1/unit/";

#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("unit {0} already exists")]
    UnitExists(String),
    #[error("no unit {0} is loaded")]
    NoSuchUnit(String),
    #[error("systemd D-Bus call {call} for {unit} failed: {source}")]
    Call {
        call: &'static str,
        unit: String,
        source: zbus::Error,
    },
    #[error("systemd did not answer {call} for {unit} within {secs} s")]
    NoAnswer {
        call: &'static str,
        unit: String,
        secs: u64,
    },
    #[error("cannot connect to the system bus: {0}; is dbus running (DBUS_SYSTEM_BUS_ADDRESS)?")]
    Connect(zbus::Error),
}

impl SystemdError {
    /// The call may not have reached systemd, or its answer was lost (no
    /// reply, the bus's limits, a timeout): what systemd did is unknown,
    /// and the call may be made again.
    pub fn is_transient(&self) -> bool {
        const TRANSIENT: &[&str] = &[
            "org.freedesktop.DBus.Error.NoReply",
            "org.freedesktop.DBus.Error.LimitsExceeded",
            "org.freedesktop.DBus.Error.Timeout",
            "org.freedesktop.DBus.Error.TimedOut",
            "org.freedesktop.DBus.Error.ServiceUnknown",
            "org.freedesktop.DBus.Error.NameHasNoOwner",
            "org.freedesktop.DBus.Error.Disconnected",
        ];
        match self {
            SystemdError::Call { source, .. } => match source {
                zbus::Error::MethodError(name, _, _) => TRANSIENT.contains(&name.as_str()),
                // zbus turns the bus's own errors into fdo::Error.
                zbus::Error::FDO(e) => {
                    TRANSIENT.contains(&zbus::DBusError::name(e.as_ref()).as_str())
                }
                zbus::Error::InputOutput(_) | zbus::Error::InterfaceNotFound => true,
                _ => false,
            },
            SystemdError::NoAnswer { .. } => true,
            _ => false,
        }
    }
}

/// systemd's answer to a Subscribe from a name it counts as subscribed.
const ALREADY_SUBSCRIBED: &str = "org.freedesktop.systemd1.AlreadySubscribed";

fn call_err<'a>(
    call: &'static str,
    unit: &'a str,
) -> impl FnOnce(zbus::Error) -> SystemdError + 'a {
    move |source| {
        if let zbus::Error::MethodError(name, _, _) = &source {
            match name.as_str() {
                "org.freedesktop.systemd1.UnitExists" => {
                    return SystemdError::UnitExists(unit.to_owned())
                }
                "org.freedesktop.systemd1.NoSuchUnit" => {
                    return SystemdError::NoSuchUnit(unit.to_owned())
                }
                _ => {}
            }
        }
        SystemdError::Call {
            call,
            unit: unit.to_owned(),
            source,
        }
    }
}

/// systemd's object path for a unit name (sd_bus_path_encode: every byte
/// that is not ASCII alphanumeric becomes `_xx`).
pub fn unit_object_path(unit: &str) -> String {
    let mut path = String::from(UNIT_PATH_PREFIX);
    for (i, b) in unit.bytes().enumerate() {
        if b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()) {
            path.push(b as char);
        } else {
            path.push_str(&format!("_{b:02x}"));
        }
    }
    path
}

/// The inverse of [`unit_object_path`]; None for paths of other objects.
pub fn unit_name_from_path(path: &str) -> Option<String> {
    let label = path.strip_prefix(UNIT_PATH_PREFIX)?;
    let bytes = label.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'_' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A signal worth a look at one unit.
#[derive(Debug, Clone)]
pub enum UnitSignal {
    /// A job (start, stop) of this unit finished.
    JobRemoved { unit: String, result: String },
    /// The unit's ActiveState changed. `state`: the whole state as the
    /// signal pair carried it (systemd sends a unit's type interface, then
    /// its Unit interface, both complete, "so that clients get atomic
    /// behavior"), which spares a round trip into a busy systemd; None when
    /// the Service half was not seen.
    StateChanged {
        unit: String,
        active_state: String,
        state: Option<Box<UnitState>>,
    },
    /// systemd's bus name changed hands: signals may have been missed and
    /// its subscription list is new.
    SystemdReconnected,
}

impl UnitSignal {
    pub fn unit(&self) -> &str {
        match self {
            UnitSignal::JobRemoved { unit, .. } | UnitSignal::StateChanged { unit, .. } => unit,
            UnitSignal::SystemdReconnected => "",
        }
    }
}

impl UnitState {
    /// The state from the properties of the unit's two interfaces: read
    /// with GetAll, or as the PropertiesChanged signals carried them.
    pub fn from_properties(
        unit_props: &HashMap<String, OwnedVariant>,
        service_props: &HashMap<String, OwnedVariant>,
    ) -> UnitState {
        let string = |m: &HashMap<String, OwnedVariant>, k: &str| {
            m.get(k)
                .and_then(|v| v.try_clone().ok())
                .and_then(|v| String::try_from(v).ok())
                .unwrap_or_default()
        };
        let int = |m: &HashMap<String, OwnedVariant>, k: &str| {
            m.get(k).and_then(|v| i32::try_from(v).ok()).unwrap_or(0)
        };
        let micros = |m: &HashMap<String, OwnedVariant>, k: &str| {
            m.get(k).and_then(|v| u64::try_from(v).ok()).unwrap_or(0)
        };
        let has_pending_job = unit_props
            .get("Job")
            .and_then(|v| v.try_clone().ok())
            .and_then(|v| <(u32, OwnedObjectPath)>::try_from(v).ok())
            .is_some_and(|(id, _)| id != 0);
        let invocation_id = unit_props
            .get("InvocationID")
            .and_then(|v| v.try_clone().ok())
            .and_then(|v| Vec::<u8>::try_from(v).ok())
            .filter(|b| !b.is_empty())
            .map(|b| b.iter().map(|x| format!("{x:02x}")).collect());
        UnitState {
            active_state: string(unit_props, "ActiveState"),
            has_pending_job,
            invocation_id,
            main_pid: service_props
                .get("ExecMainPID")
                .and_then(|v| u32::try_from(v).ok())
                .unwrap_or(0),
            result: string(service_props, "Result"),
            exec_main_code: int(service_props, "ExecMainCode"),
            exec_main_status: int(service_props, "ExecMainStatus"),
            exec_main_start: micros(service_props, "ExecMainStartTimestamp"),
            exec_main_exit: micros(service_props, "ExecMainExitTimestamp"),
            inactive_enter: micros(unit_props, "InactiveEnterTimestamp"),
            freezer_state: string(unit_props, "FreezerState"),
        }
    }
}

#[derive(Clone)]
pub struct Systemd {
    conn: Connection,
    manager: ManagerProxy<'static>,
    /// Releases sent in the background at once ([`MAX_BACKGROUND_RELEASES`]).
    releases: std::sync::Arc<tokio::sync::Semaphore>,
    /// Background releases not yet done: their references still count
    /// against what systemd tracks ([`Systemd::releases_pending`]).
    releases_pending: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

/// How long one release call may take before it is given up (the unit
/// is collected anyway once ptraind's connection closes).
const RELEASE_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Background releases (two calls each) out at once. dbus-daemon refuses
/// a connection's calls past 128 awaiting replies
/// (`max_replies_per_connection`), and the calls it refuses are anyone's:
/// a burst's ends released hundreds of kept units at once, and ptraind's
/// own Subscribe and StartTransientUnit calls were refused with them.
const MAX_BACKGROUND_RELEASES: usize = 16;

/// Tells systemd's messages from everyone else's: the unique name that owns
/// org.freedesktop.systemd1, asked once and then kept current from the bus
/// driver's NameOwnerChanged (whose sender, "org.freedesktop.DBus", only
/// dbus-daemon can have). The signal streams never wait on a call: a flood
/// of forged signals must not stall the connection they share with the
/// replies ptraind waits for.
#[derive(Clone)]
struct SystemdSender {
    owner: std::sync::Arc<std::sync::Mutex<Option<String>>>,
    refused: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl SystemdSender {
    /// `changed` runs when systemd's bus name gets a new owner (systemd
    /// re-executed or reconnected), not when it loses one: signals may
    /// have been missed meanwhile.
    async fn new(
        conn: &Connection,
        changed: impl Fn() + Send + Sync + 'static,
    ) -> Result<SystemdSender, SystemdError> {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender("org.freedesktop.DBus")
            .interface("org.freedesktop.DBus")
            .member("NameOwnerChanged")
            .arg(0, SYSTEMD)
            .build()
            .map_err(call_err("build match rule", "-"))?;
        let mut changes = zbus::MessageStream::for_match_rule(rule, conn, None)
            .await
            .map_err(call_err("AddMatch NameOwnerChanged", "-"))?;
        let dbus = zbus::fdo::DBusProxy::new(conn)
            .await
            .map_err(SystemdError::Connect)?;
        let name = zbus::names::BusName::try_from(SYSTEMD).expect("a valid bus name");
        let owner = dbus
            .get_name_owner(name)
            .await
            .map_err(|e| SystemdError::Connect(e.into()))?;
        let this = SystemdSender {
            owner: std::sync::Arc::new(std::sync::Mutex::new(Some(owner.to_string()))),
            refused: Default::default(),
        };
        let cache = this.owner.clone();
        tokio::spawn(async move {
            while let Some(Ok(msg)) = changes.next().await {
                let header = msg.header();
                if header.sender().map(|s| s.as_str()) != Some("org.freedesktop.DBus") {
                    continue;
                }
                let Ok((name, _, new)) = msg.body().deserialize::<(String, String, String)>()
                else {
                    continue;
                };
                if name != SYSTEMD {
                    continue;
                }
                tracing::info!(owner = new, "systemd's bus name has a new owner");
                let back = !new.is_empty();
                if let Ok(mut cached) = cache.lock() {
                    *cached = Some(new).filter(|n| !n.is_empty());
                }
                // Only once it is back: while the name has no owner there
                // is nobody to subscribe to or look at.
                if back {
                    changed();
                }
            }
        });
        Ok(this)
    }

    fn is_systemd(&self, msg: &zbus::Message) -> bool {
        let header = msg.header();
        let Some(sender) = header.sender() else {
            return false;
        };
        let cached = self.owner.lock().ok().and_then(|o| o.clone());
        if cached.as_deref() == Some(sender.as_str()) {
            return true;
        }
        // The 1st, 2nd, 4th, 8th, ... refusal is logged: a flood of forged
        // signals must not flood the journal.
        let n = self
            .refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                sender = sender.as_str(),
                member = header.member().map(|m| m.as_str()).unwrap_or("-"),
                path = header.path().map(|p| p.as_str()).unwrap_or("-"),
                "ignoring a systemd signal that systemd did not send ({n} refused so far)"
            );
        }
        false
    }
}

/// Drops our reference on a unit and clears a failed state, so systemd
/// collects it. Failures only mean it is gone already.
async fn release_unit(manager: &ManagerProxy<'static>, unit: &str) {
    if let Err(e) = manager.unref_unit(unit.to_owned()).await {
        tracing::debug!(unit, error = %e, "UnrefUnit");
    }
    if let Err(e) = manager.reset_failed_unit(unit.to_owned()).await {
        tracing::debug!(unit, error = %e, "ResetFailedUnit");
    }
}

impl Systemd {
    /// Connects to the system bus and subscribes to unit signals. The
    /// connection must stay up for the subscription to hold.
    pub async fn connect() -> Result<Systemd, SystemdError> {
        let conn = Connection::system().await.map_err(SystemdError::Connect)?;
        let manager = ManagerProxy::new(&conn)
            .await
            .map_err(SystemdError::Connect)?;
        manager
            .subscribe()
            .await
            .map_err(call_err("Subscribe", "-"))?;
        Ok(Systemd {
            conn,
            manager,
            releases: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_BACKGROUND_RELEASES)),
            releases_pending: Default::default(),
        })
    }

    /// Asks systemd again for unit signals (after it reconnected).
    /// Subscribes again after systemd came back on the bus. "Already
    /// subscribed" is a success: systemd answers it only to a name it
    /// counts as a subscriber on its current connection, and it keeps its
    /// subscribers across `daemon-reexec` and `daemon-reload`. Taken for a
    /// failure, it made ptraind retry for 30 s and exit (`make bench`: 14
    /// restarts in a 10,000-job burst, where systemd was cut off the bus
    /// and each loss and return of its name started a resubscription, the
    /// second of which was told "already subscribed").
    pub async fn resubscribe(&self) -> Result<(), SystemdError> {
        match self.manager.subscribe().await {
            Err(zbus::Error::MethodError(name, _, _)) if name.as_str() == ALREADY_SUBSCRIBED => {
                Ok(())
            }
            other => other.map_err(call_err("Subscribe", "-")),
        }
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Starts forwarding unit signals of units whose name starts with one
    /// of `unit_prefixes` to `sink`. Two tasks drain the D-Bus streams
    /// continuously so that a busy consumer can never block the connection
    /// (and with it the replies to our own calls). A stream that ends (the
    /// bus connection is gone) is reported to `lost` with its name: without
    /// it ptraind would never again see a job end.
    ///
    /// Only systemd's own signals pass. A match rule's sender does not
    /// filter what reaches us: any client may send a signal addressed to
    /// our unique name, with any path and body. The sender field, though,
    /// is set by dbus-daemon, so each message's sender is checked against
    /// the current owner of org.freedesktop.systemd1 (`SystemdSender`).
    pub async fn forward_signals(
        &self,
        unit_prefixes: &'static [&'static str],
        sink: impl Fn(UnitSignal) + Send + Sync + Clone + 'static,
        lost: impl Fn(&'static str) + Send + Sync + Clone + 'static,
    ) -> Result<(), SystemdError> {
        let sink0 = sink.clone();
        let sender =
            SystemdSender::new(&self.conn, move || sink0(UnitSignal::SystemdReconnected)).await?;
        let path_prefixes: Vec<String> =
            unit_prefixes.iter().map(|p| unit_object_path(p)).collect();
        let wanted_unit = move |unit: &str| unit_prefixes.iter().any(|p| unit.starts_with(p));
        let wanted_path =
            move |path: &str| path_prefixes.iter().any(|p| path.starts_with(p.as_str()));
        let removed_rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(SYSTEMD)
            .interface("org.freedesktop.systemd1.Manager")
            .member("JobRemoved")
            .path("/org/freedesktop/systemd1")
            .build()
            .map_err(call_err("build match rule", "-"))?;
        let mut removed = zbus::MessageStream::for_match_rule(removed_rule, &self.conn, None)
            .await
            .map_err(call_err("AddMatch JobRemoved", "-"))?;
        let sink1 = sink.clone();
        let lost1 = lost.clone();
        let sender1 = sender.clone();

        tokio::spawn(async move {
            while let Some(msg) = removed.next().await {
                let Ok(msg) = msg else { continue };
                if !sender1.is_systemd(&msg) {
                    continue;
                }
                let Ok((_, _, unit, result)) =
                    msg.body()
                        .deserialize::<(u32, zbus::ObjectPath<'_>, String, String)>()
                else {
                    continue;
                };
                if wanted_unit(&unit) {
                    sink1(UnitSignal::JobRemoved { unit, result });
                }
            }
            lost1("JobRemoved");
        });
        let changes_rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .sender(SYSTEMD)
            .interface("org.freedesktop.DBus.Properties")
            .member("PropertiesChanged")
            .path_namespace("/org/freedesktop/systemd1/unit")
            .build()
            .map_err(call_err("build match rule", "-"))?;
        let mut changes = zbus::MessageStream::for_match_rule(changes_rule, &self.conn, None)
            .await
            .map_err(call_err("AddMatch PropertiesChanged", "-"))?;
        tokio::spawn(async move {
            // The Service half of each pair, until its Unit half comes.
            let mut service_half: HashMap<String, HashMap<String, OwnedVariant>> = HashMap::new();
            while let Some(msg) = changes.next().await {
                let Ok(msg) = msg else { continue };
                let header = msg.header();
                let Some(path) = header.path() else { continue };
                if !wanted_path(path.as_str()) {
                    continue;
                }
                let Some(unit) = unit_name_from_path(path.as_str()) else {
                    continue;
                };
                if !sender.is_systemd(&msg) {
                    continue;
                }
                let Ok((interface, changed, _)) =
                    msg.body()
                        .deserialize::<(String, HashMap<String, OwnedVariant>, Vec<String>)>()
                else {
                    continue;
                };
                if interface == SERVICE_IFACE {
                    service_half.insert(unit, changed);
                    continue;
                }
                if interface != UNIT_IFACE {
                    continue;
                }
                let service = service_half.remove(&unit);
                let Some(active_state) = changed
                    .get("ActiveState")
                    .and_then(|v| v.try_clone().ok())
                    .and_then(|v| String::try_from(v).ok())
                else {
                    continue;
                };
                let state =
                    service.map(|service| Box::new(UnitState::from_properties(&changed, &service)));
                sink(UnitSignal::StateChanged {
                    unit,
                    active_state,
                    state,
                });
            }
            lost("PropertiesChanged");
        });
        Ok(())
    }

    /// StartTransientUnit with AddRef, so the unit outlives its end until
    /// we have read it.
    pub async fn start_unit(
        &self,
        unit: &str,
        properties: &UnitProperties,
    ) -> Result<OwnedObjectPath, SystemdError> {
        let mut props: Vec<(String, OwnedVariant)> = Vec::with_capacity(properties.len() + 1);
        for (key, value) in properties {
            props.push((key.to_string(), to_variant(value)));
        }
        props.push(("AddRef".into(), OwnedVariant::from(true)));
        self.manager
            .start_transient_unit(unit.to_owned(), "fail".into(), props, Vec::new())
            .await
            .map_err(call_err("StartTransientUnit", unit))
    }

    /// Takes a reference on an existing unit (adoption after a restart).
    pub async fn ref_unit(&self, unit: &str) -> Result<(), SystemdError> {
        self.manager
            .ref_unit(unit.to_owned())
            .await
            .map_err(call_err("RefUnit", unit))
    }

    /// Lets systemd collect a unit whose end is recorded (see
    /// `release_unit`), without waiting: the job's end is on disk
    /// already, and the next job (on the GPU this one freed) need not wait
    /// behind two more calls into a busy systemd.
    pub fn release_in_background(&self, unit: String) {
        use std::sync::atomic::Ordering;
        let manager = self.manager.clone();
        let releases = self.releases.clone();
        let pending = self.releases_pending.clone();
        pending.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            // Closed never: the semaphore lives as long as any clone.
            let _permit = releases.acquire_owned().await;
            let release = release_unit(&manager, &unit);
            if tokio::time::timeout(RELEASE_CALL_TIMEOUT, release)
                .await
                .is_err()
            {
                tracing::warn!(
                    unit,
                    "systemd did not answer the release of a unit in {RELEASE_CALL_TIMEOUT:?}"
                );
            }
            pending.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// Units released in the background whose release is not done yet.
    pub fn releases_pending(&self) -> usize {
        self.releases_pending
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lets systemd collect a unit now, awaiting both calls.
    pub async fn release_now(&self, unit: &str) {
        release_unit(&self.manager, unit).await;
    }

    pub async fn stop_unit(&self, unit: &str) -> Result<(), SystemdError> {
        self.manager
            .stop_unit(unit.to_owned(), "replace".into())
            .await
            .map(|_| ())
            .map_err(call_err("StopUnit", unit))
    }

    /// Sends `signal` to the unit's main process: a job's checkpoint
    /// signal goes to the command ptraind started, not to its workers
    /// (a DataLoader worker dies of a SIGUSR1 it does not handle).
    pub async fn signal_main(&self, unit: &str, signal: i32) -> Result<(), SystemdError> {
        self.manager
            .kill_unit(unit.to_owned(), "main".into(), signal)
            .await
            .map_err(call_err("KillUnit", unit))
    }

    /// Freezes every process of the unit (cgroup v2's freezer): they keep
    /// their memory, GPU contexts included, and run no instruction.
    pub async fn freeze_unit(&self, unit: &str) -> Result<(), SystemdError> {
        self.manager
            .freeze_unit(unit.to_owned())
            .await
            .map_err(call_err("FreezeUnit", unit))
    }

    pub async fn thaw_unit(&self, unit: &str) -> Result<(), SystemdError> {
        self.manager
            .thaw_unit(unit.to_owned())
            .await
            .map_err(call_err("ThawUnit", unit))
    }

    /// Whether any of `units` is loaded and not yet done: active or
    /// activating or deactivating, or with a job queued. One call for all.
    pub async fn any_pending(&self, units: &[String]) -> Result<bool, SystemdError> {
        let listed = self
            .manager
            .list_units_by_names(units.to_vec())
            .await
            .map_err(call_err("ListUnitsByNames", "-"))?;
        // (name, description, load, active, sub, following, path, job id, ...)
        Ok(listed.iter().any(|unit| {
            unit.2 == "loaded" && (!matches!(unit.3.as_str(), "inactive" | "failed") || unit.7 != 0)
        }))
    }

    /// Is a unit of this name loaded? Returns its state if so.
    pub async fn unit_state(&self, unit: &str) -> Result<UnitState, SystemdError> {
        // GetUnit fails with NoSuchUnit for a unit that is not loaded; the
        // computed path would instead answer with an empty "inactive" ghost.
        // The three calls go out together: systemd answers them back to
        // back instead of after three round trips through its queue, which
        // is long while it starts and stops other jobs.
        let path = unit_object_path(unit);
        let (loaded, unit_props, service_props) = futures_util::join!(
            self.manager.get_unit(unit.to_owned()),
            self.get_all(&path, UNIT_IFACE, unit),
            self.get_all(&path, SERVICE_IFACE, unit),
        );
        loaded.map_err(call_err("GetUnit", unit))?;
        Ok(UnitState::from_properties(&unit_props?, &service_props?))
    }

    async fn get_all(
        &self,
        path: &str,
        interface: &str,
        unit: &str,
    ) -> Result<HashMap<String, OwnedVariant>, SystemdError> {
        let reply = self
            .conn
            .call_method(
                Some(SYSTEMD),
                path,
                Some("org.freedesktop.DBus.Properties"),
                "GetAll",
                &(interface,),
            )
            .await
            .map_err(call_err("GetAll", unit))?;
        reply
            .body()
            .deserialize::<HashMap<String, OwnedVariant>>()
            .map_err(call_err("GetAll (decode)", unit))
    }
}

/// One unit property as the D-Bus variant StartTransientUnit takes.
pub fn to_variant(value: &PropValue) -> OwnedVariant {
    let variant = match value {
        PropValue::Str(s) => zbus::Variant::from(s.clone()),
        PropValue::Bool(b) => zbus::Variant::from(*b),
        PropValue::U64(n) => zbus::Variant::from(*n),
        PropValue::U32(n) => zbus::Variant::from(*n),
        PropValue::ByteStrings(list) => zbus::Variant::from(list.clone()),
        PropValue::StrList(list) => zbus::Variant::from(list.clone()),
        PropValue::Exec(cmds) => zbus::Variant::from(cmds.clone()),
        PropValue::Pairs(pairs) => zbus::Variant::from(pairs.clone()),
        PropValue::Binds(binds) => zbus::Variant::from(binds.clone()),
    };
    OwnedVariant::try_from(variant).expect("plain values convert without file descriptors")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_answers_are_transient_and_refusals_are_not() {
        let call = |source: zbus::Error| SystemdError::Call {
            call: "StartTransientUnit",
            unit: "u".into(),
            source,
        };
        let no_reply = zbus::Error::FDO(Box::new(zbus::fdo::Error::NoReply(
            "Message recipient disconnected from message bus without replying".into(),
        )));
        assert!(call(no_reply).is_transient());
        let limits = zbus::Error::FDO(Box::new(zbus::fdo::Error::LimitsExceeded("x".into())));
        assert!(call(limits).is_transient());
        let invalid = zbus::Error::FDO(Box::new(zbus::fdo::Error::InvalidArgs("x".into())));
        assert!(!call(invalid).is_transient());
        assert!(!SystemdError::UnitExists("u".into()).is_transient());
    }

    #[test]
    fn unit_paths_round_trip() {
        let unit = "ptrain-job@resnet-lr0.1_x.service";
        let path = unit_object_path(unit);
        assert_eq!(
            path,
            "/org/freedesktop/systemd1/unit/ptrain_2djob_40resnet_2dlr0_2e1_5fx_2eservice"
        );
        assert_eq!(unit_name_from_path(&path).as_deref(), Some(unit));
        assert_eq!(unit_name_from_path("/org/freedesktop/systemd1/job/1"), None);
    }
}
