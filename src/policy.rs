//! Per-user and per-group GPU policy: the config's `[policy]` table.
//!
//! ```toml
//! [policy.default]            # every user without an entry of their own
//! max_gpus = 4
//!
//! [policy.users.alice]        # replaces [policy.default] for alice
//! max_gpus = 2
//! allowed_gpus = [0, 1]
//!
//! [policy.groups.students]    # every member, primary or supplementary
//! max_gpus = 4                # the whole group together, at once
//! allowed_gpus = [2, 3]
//! ```
//!
//! The rules that apply to a job are its owner's user rule
//! (`policy.users.NAME`, else `policy.default`) and the rule of every group
//! the owner belongs to. A GPU is allowed only if every applicable rule
//! that sets `allowed_gpus` lists it. `max_gpus` caps the GPUs held at once:
//! by that user's jobs for a user (or default) rule, by all members' jobs
//! together for a group rule. A job that can never fit its rules is rejected
//! when it is submitted; one that fits but finds its cap in use waits. It
//! reserves no GPU meanwhile, but its share of the cap is kept: a job
//! behind it under the same cap counts it as held, so her later small jobs
//! cannot starve her big one (see [`crate::scheduler`]).
//!
//! Pure: group names are resolved to gids by a lookup the caller passes
//! ([`Policy::resolve`]); the system's is `Policy::from_system`, in
//! [`crate::config`], over [`crate::users::gid_of_group`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

use crate::setting::InvalidSetting;
use crate::spec::MAX_GPU_INDEX;
use crate::users::Owner;

/// The `[policy]` table as written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `[policy.default]`: users without a `[policy.users.NAME]` entry.
    pub default: Option<Limits>,
    pub users: BTreeMap<String, Limits>,
    pub groups: BTreeMap<String, Limits>,
    /// `[policy] preempt`: a queued job that cannot start may stop
    /// running `preemptible` jobs of lower priority ([`crate::preemption`]).
    /// Off by default.
    pub preempt: bool,
    /// `[policy] fair_share = { half_life = "7d" }`: waiting jobs of
    /// equal priority go by their owners' recent GPU use
    /// ([`crate::fair_share`]). Off by default.
    pub fair_share: Option<crate::fair_share::FairShareConfig>,
}

/// One rule's limits; an absent key means no limit of that kind.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// GPUs held at once; 0 denies GPUs altogether.
    pub max_gpus: Option<u32>,
    /// GPU indices (as `ptrain gpus` shows them) jobs may be given.
    pub allowed_gpus: Option<Vec<u32>>,
}

impl PolicyConfig {
    /// The fair-share half-life, when fair share is on (checked by
    /// [`PolicyConfig::validate`]).
    pub fn fair_share_half_life(&self) -> Option<std::time::Duration> {
        self.fair_share.as_ref().and_then(|f| f.half_life().ok())
    }

    /// Checks what serde cannot; the error names the key and the fix.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let err = |key: String, message: String| Err(InvalidSetting { key, message });
        if let Some(fair_share) = &self.fair_share {
            fair_share.half_life()?;
        }
        let entries = self
            .default
            .iter()
            .map(|l| ("policy.default".to_owned(), None, l))
            .chain(
                self.users
                    .iter()
                    .map(|(n, l)| (format!("policy.users.{n}"), Some(("user", n)), l)),
            )
            .chain(
                self.groups
                    .iter()
                    .map(|(n, l)| (format!("policy.groups.{n}"), Some(("group", n)), l)),
            );
        for (key, name, limits) in entries {
            if let Some((what, name)) = name {
                if !is_account_name(name) {
                    return err(
                        key,
                        format!(
                            "{name:?} is not a {what} name; write the name as `getent {}` prints it",
                            if what == "user" { "passwd" } else { "group" }
                        ),
                    );
                }
            }
            if limits.max_gpus.is_none() && limits.allowed_gpus.is_none() {
                return err(
                    key,
                    "sets no limit; add `max_gpus = N` and/or `allowed_gpus = [..]`, or remove the entry"
                        .to_owned(),
                );
            }
            if let Some(list) = &limits.allowed_gpus {
                let mut seen = BTreeSet::new();
                for (i, index) in list.iter().enumerate() {
                    if *index > MAX_GPU_INDEX {
                        return err(
                            format!("{key}.allowed_gpus[{i}]"),
                            format!(
                                "{index} is not a GPU index; use the indices `ptrain gpus` shows (0 to {MAX_GPU_INDEX})"
                            ),
                        );
                    }
                    if !seen.insert(*index) {
                        return err(
                            format!("{key}.allowed_gpus[{i}]"),
                            format!("repeats GPU {index}; list each GPU once"),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

/// A plausible user or group name (what useradd/groupadd accept, loosely).
fn is_account_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 255
        && !b[0].is_ascii_digit()
        && b[0] != b'-'
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b'$'))
}

/// Who a rule's `max_gpus` counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The jobs of the user with this name.
    User(String),
    /// The jobs of every member of the group with this gid.
    Group(u32),
}

impl Scope {
    pub fn covers(&self, owner: &Owner) -> bool {
        match self {
            Scope::User(name) => owner.name == *name,
            Scope::Group(gid) => owner.gid == *gid || owner.groups.contains(gid),
        }
    }
}

/// One rule that applies to a job.
#[derive(Clone, Debug)]
pub struct Rule<'a> {
    /// The config key, for messages: `policy.users.alice`.
    pub key: String,
    pub scope: Scope,
    pub limits: &'a Limits,
}

impl Rule<'_> {
    pub fn allows(&self, index: u32) -> bool {
        self.limits
            .allowed_gpus
            .as_ref()
            .is_none_or(|l| l.contains(&index))
    }
}

/// The policy with group names resolved to gids.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    default: Option<Limits>,
    users: BTreeMap<String, Limits>,
    groups: Vec<(String, u32, Limits)>,
}

impl Policy {
    /// No limits at all.
    pub fn none() -> Policy {
        Policy::default()
    }

    /// Resolves group names with `gid_of`. A group that does not exist has
    /// no members, so its rule applies to nobody; it is returned among the
    /// names to warn about (a typo would otherwise go unnoticed).
    pub fn resolve(
        cfg: &PolicyConfig,
        mut gid_of: impl FnMut(&str) -> Option<u32>,
    ) -> (Policy, Vec<String>) {
        let mut unknown = Vec::new();
        let groups = cfg
            .groups
            .iter()
            .filter_map(|(name, limits)| match gid_of(name) {
                Some(gid) => Some((name.clone(), gid, limits.clone())),
                None => {
                    unknown.push(name.clone());
                    None
                }
            })
            .collect();
        let policy = Policy {
            default: cfg.default.clone(),
            users: cfg.users.clone(),
            groups,
        };
        (policy, unknown)
    }

    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.users.is_empty() && self.groups.is_empty()
    }

    /// The rules that apply to a job of `owner`.
    pub fn rules_for(&self, owner: &Owner) -> Vec<Rule<'_>> {
        let mut rules = Vec::new();
        if let Some(limits) = self.users.get(&owner.name) {
            rules.push(Rule {
                key: format!("policy.users.{}", owner.name),
                scope: Scope::User(owner.name.clone()),
                limits,
            });
        } else if let Some(limits) = &self.default {
            rules.push(Rule {
                key: "policy.default".to_owned(),
                scope: Scope::User(owner.name.clone()),
                limits,
            });
        }
        for (name, gid, limits) in &self.groups {
            let scope = Scope::Group(*gid);
            if scope.covers(owner) {
                rules.push(Rule {
                    key: format!("policy.groups.{name}"),
                    scope,
                    limits,
                });
            }
        }
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(name: &str, gid: u32, groups: &[u32]) -> Owner {
        Owner {
            uid: 1000,
            gid,
            name: name.into(),
            home: "/home/x".into(),
            groups: groups.to_vec(),
        }
    }

    fn parse(text: &str) -> PolicyConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn parses_and_validates() {
        let cfg = parse(
            r#"
            [default]
            max_gpus = 4
            [users.alice]
            max_gpus = 2
            allowed_gpus = [0, 1]
            [groups.students]
            allowed_gpus = [2, 3]
            "#,
        );
        cfg.validate().unwrap();
        assert_eq!(cfg.default.as_ref().unwrap().max_gpus, Some(4));
        assert_eq!(cfg.users["alice"].allowed_gpus, Some(vec![0, 1]));
        assert_eq!(cfg.groups["students"].max_gpus, None);
        assert_eq!(parse(""), PolicyConfig::default());
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(toml::from_str::<PolicyConfig>("[users.alice]\nmax_gpu = 1\n").is_err());
        assert!(toml::from_str::<PolicyConfig>("[user.alice]\nmax_gpus = 1\n").is_err());
        assert!(toml::from_str::<PolicyConfig>("[users.alice]\nmax_gpus = -1\n").is_err());
    }

    #[test]
    fn validation_names_the_key_and_fix() {
        let check = |text: &str, key: &str| {
            let e = parse(text).validate().unwrap_err();
            assert_eq!(e.key, key, "{e:?}");
            assert!(e.message.contains(';'), "{e:?} should say how to fix it");
        };
        check("[users.alice]\n", "policy.users.alice");
        check("[default]\n", "policy.default");
        check(
            "[users.alice]\nallowed_gpus = [0, 0]\n",
            "policy.users.alice.allowed_gpus[1]",
        );
        check(
            "[groups.lab]\nallowed_gpus = [1, 99999]\n",
            "policy.groups.lab.allowed_gpus[1]",
        );
        check("[users.\"a b\"]\nmax_gpus = 1\n", "policy.users.a b");
        check("[groups.\"1x\"]\nmax_gpus = 1\n", "policy.groups.1x");
        // Denying GPUs altogether is a valid policy.
        parse("[users.alice]\nmax_gpus = 0\n").validate().unwrap();
        parse("[users.alice]\nallowed_gpus = []\n")
            .validate()
            .unwrap();
    }

    #[test]
    fn rules_user_replaces_default_groups_add() {
        let cfg = parse(
            r#"
            [default]
            max_gpus = 4
            [users.alice]
            max_gpus = 1
            [groups.lab]
            max_gpus = 3
            allowed_gpus = [0, 1, 2]
            [groups.ghost]
            max_gpus = 1
            "#,
        );
        let (policy, unknown) = Policy::resolve(&cfg, |name| (name == "lab").then_some(50));
        assert_eq!(unknown, ["ghost"]);

        let alice = owner("alice", 100, &[50]);
        let rules = policy.rules_for(&alice);
        let keys: Vec<&str> = rules.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(keys, ["policy.users.alice", "policy.groups.lab"]);
        assert_eq!(rules[0].scope, Scope::User("alice".into()));
        assert_eq!(rules[1].scope, Scope::Group(50));
        assert!(rules[1].allows(2) && !rules[1].allows(3));
        assert!(rules[0].allows(3));

        // Bob has no entry: the default; primary-group membership counts.
        let bob = owner("bob", 50, &[]);
        let keys: Vec<String> = policy.rules_for(&bob).into_iter().map(|r| r.key).collect();
        assert_eq!(keys, ["policy.default", "policy.groups.lab"]);

        let carol = owner("carol", 7, &[8]);
        let keys: Vec<String> = policy
            .rules_for(&carol)
            .into_iter()
            .map(|r| r.key)
            .collect();
        assert_eq!(keys, ["policy.default"]);

        assert!(Policy::none().rules_for(&carol).is_empty());
        assert!(Policy::none().is_empty() && !policy.is_empty());
    }

    #[test]
    fn scope_covers_members() {
        let o = owner("alice", 100, &[7, 9]);
        assert!(Scope::User("alice".into()).covers(&o));
        assert!(!Scope::User("bob".into()).covers(&o));
        assert!(Scope::Group(100).covers(&o));
        assert!(Scope::Group(9).covers(&o));
        assert!(!Scope::Group(8).covers(&o));
    }
}
