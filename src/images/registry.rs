//! Pulling an image from a registry (Docker Registry HTTP API v2) into
//! the blob store.
//!
//! `GET /v2/NAME/manifests/REF` with the OCI and Docker manifest types
//! accepted; an index or manifest list is resolved to the manifest for
//! the platform; then the config and each layer by `GET
//! /v2/NAME/blobs/DIGEST` (redirects followed: registries send blobs
//! from object storage; reqwest drops the Authorization header on a
//! redirect to another host). Every body streams through a
//! [`super::blobs::BlobWriter`]: counted against its bound, hashed,
//! stored under its digest only when it matches; a manifest pulled by tag
//! is stored under the digest of its bytes.
//!
//! A 401 is answered once per pull: `WWW-Authenticate: Bearer
//! realm=...,service=...,scope=...` gets a token from the realm (with the
//! registry's [`Credentials`] as Basic auth when there are some, else
//! anonymously), `Basic` gets the credentials. Plain http is used only
//! for a registry the admin lists as insecure, loopback ones included (a
//! loopback port is not proof of whose server answers: while the admin's
//! registry is down any local user can bind it), and a token realm must be
//! https under the same rule, so credentials never cross in clear to a
//! server nobody vouched for.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::blobs::{BlobError, BlobStore, FetchLimits, Fetched};
use super::manifest::{
    choose_manifest, parse_manifest, Descriptor, Manifest, ManifestError, Platform, MANIFEST_ACCEPT,
};
use super::reference::{Digest, ImageReference};

/// A registry account. Where it comes from is the daemon's business.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// How the client reaches registries.
#[derive(Clone, Debug, Default)]
pub struct RegistryOptions {
    /// Registries (as references name them: `host[:port]`) reached over
    /// plain http; every other one, loopback ones too, over https.
    pub insecure: BTreeSet<String>,
    /// Credentials by registry (`docker.io`, `ghcr.io`, `host:port`).
    pub credentials: BTreeMap<String, Credentials>,
    pub limits: FetchLimits,
    /// The platform an index is resolved for.
    pub platform: Option<Platform>,
}

/// How far a pull is: `done` of `total` bytes over all the blobs it
/// fetches (blobs already stored count as done), and the blob now read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullProgress {
    pub digest: Digest,
    pub done: u64,
    pub total: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{url}: {detail}; check the registry's address and the network{}",
        if url.starts_with("https:") { " (a registry that serves plain http must be listed in [images] insecure_registries)" } else { "" })]
    Http { url: String, detail: String },
    #[error("{url}: HTTP {status}: {hint}")]
    Status {
        url: String,
        status: u16,
        hint: &'static str,
    },
    #[error("registry {registry}: {problem}; {fix}")]
    Auth {
        registry: String,
        problem: String,
        fix: &'static str,
    },
    #[error(transparent)]
    Blob(#[from] BlobError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
}

fn status_hint(status: u16) -> &'static str {
    match status {
        404 => "no such image, tag or blob; check the reference",
        401 | 403 => "access denied; check the registry credentials and that the account may pull this repository",
        429 => "the registry limits pulls; try again later or pull with credentials",
        500..=599 => "the registry failed; try again later",
        _ => "the registry refused the request; check the reference",
    }
}

/// The error and its sources on one line (reqwest's own message is
/// rarely the reason).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// A `WWW-Authenticate` challenge: its scheme and parameters.
#[derive(Debug, PartialEq, Eq)]
struct Challenge {
    scheme: String,
    params: BTreeMap<String, String>,
}

/// Parses `Scheme k="v", k2=v2` (quoted values may hold commas and `\"`).
fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, mut rest) = header.split_once(' ').unwrap_or((header, ""));
    let mut params = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.split_once('=')?;
        let key = key.trim().to_ascii_lowercase();
        let after = after.trim_start();
        let value;
        if let Some(quoted) = after.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            v.push(n);
                        }
                    }
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => v.push(c),
                }
            }
            value = v;
            rest = &quoted[end?..];
        } else {
            let end = after.find(',').unwrap_or(after.len());
            value = after[..end].trim().to_string();
            rest = &after[end..];
        }
        params.insert(key, value);
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

/// The credentials a request carries.
#[derive(Clone)]
enum Auth {
    None,
    Bearer(String),
    Basic(Credentials),
}

/// Pulls images from registries.
#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    options: RegistryOptions,
}

/// Most bytes of a token response.
const MAX_TOKEN_BYTES: usize = 1 << 20;

impl RegistryClient {
    /// A client with ptrain's user agent, connect and read timeouts (no
    /// overall timeout: a large layer takes as long as it takes while
    /// bytes keep coming), following redirects.
    pub fn new(options: RegistryOptions) -> Result<RegistryClient, PullError> {
        // reqwest is built without a default crypto provider: install
        // ring's (a second install is a harmless Err).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("ptrain/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(30))
            .read_timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| PullError::Http {
                url: String::new(),
                detail: format!("cannot set up the HTTP client: {}", chain(&e)),
            })?;
        Ok(RegistryClient::with_client(http, options))
    }

    /// A client over a given `reqwest::Client` (extra CA roots, a proxy).
    pub fn with_client(http: reqwest::Client, options: RegistryOptions) -> RegistryClient {
        RegistryClient { http, options }
    }

    fn plain_http_allowed(&self, registry: &str) -> bool {
        self.options.insecure.contains(registry)
    }

    /// Pulls `reference` into `blobs`: the manifest (resolved through an
    /// index for the platform), the config and every layer not yet
    /// stored. `progress` is called as bytes arrive.
    pub async fn pull(
        &self,
        reference: &ImageReference,
        blobs: &BlobStore,
        progress: &(dyn Fn(&PullProgress) + Send + Sync),
    ) -> Result<Fetched, PullError> {
        self.pull_as(reference, blobs, progress, None).await
    }

    /// [`Self::pull`] with `credentials` for this pull alone (a user's own,
    /// or the admin's: [`super::auth`]), in place of the client's for the
    /// registry.
    pub async fn pull_as(
        &self,
        reference: &ImageReference,
        blobs: &BlobStore,
        progress: &(dyn Fn(&PullProgress) + Send + Sync),
        credentials: Option<Credentials>,
    ) -> Result<Fetched, PullError> {
        let scheme = if self.plain_http_allowed(&reference.registry) {
            "http"
        } else {
            "https"
        };
        let mut session = Session {
            client: self,
            registry: reference.registry.clone(),
            repository: reference.repository.clone(),
            base: format!(
                "{scheme}://{}/v2/{}/",
                reference.api_host(),
                reference.repository
            ),
            auth: Auth::None,
            tried_auth: false,
            credentials,
        };
        let limits = self.options.limits;
        let platform = self.options.platform.clone().unwrap_or_else(Platform::host);
        let name = reference.to_string();

        let (bytes, content_type, digest) = session
            .manifest(
                &reference.manifest_reference(),
                reference.digest.as_ref(),
                &name,
                blobs,
            )
            .await?;
        let (manifest_digest, index, manifest) =
            match parse_manifest(&name, &bytes, content_type.as_deref())? {
                Manifest::Image(m) => (digest, None, m),
                Manifest::Index(ix) => {
                    let chosen = choose_manifest(&name, &ix, &platform)?.clone();
                    let what = format!("{name} ({platform})");
                    let (bytes, content_type, d) = session
                        .manifest(
                            &chosen.digest.to_string(),
                            Some(&chosen.digest),
                            &what,
                            blobs,
                        )
                        .await?;
                    match parse_manifest(&what, &bytes, content_type.as_deref())? {
                        Manifest::Image(m) => (d, Some(digest), m),
                        Manifest::Index(_) => {
                            return Err(ManifestError::Inconsistent {
                                what,
                                problem: "an index entry for a platform is itself an index"
                                    .to_string(),
                            }
                            .into())
                        }
                    }
                }
            };

        let mut fetches: Vec<(&Descriptor, u64, String)> = vec![(
            &manifest.config,
            limits.max_config_bytes,
            format!("config of {name}"),
        )];
        for (i, layer) in manifest.layers.iter().enumerate() {
            fetches.push((
                layer,
                limits.max_layer_bytes,
                format!(
                    "layer {} of {} ({}) of {name}",
                    i + 1,
                    manifest.layers.len(),
                    layer.digest
                ),
            ));
        }
        let total: u64 = fetches.iter().map(|(d, _, _)| d.size).sum();
        let mut done: u64 = 0;
        for (descriptor, limit, what) in fetches {
            if blobs.contains(&descriptor.digest) {
                done += descriptor.size;
                progress(&PullProgress {
                    digest: descriptor.digest.clone(),
                    done,
                    total,
                });
                continue;
            }
            session
                .blob(descriptor, limit, &what, blobs, &mut |n| {
                    progress(&PullProgress {
                        digest: descriptor.digest.clone(),
                        done: done + n,
                        total,
                    })
                })
                .await?;
            done += descriptor.size;
        }
        Ok(Fetched {
            source: name,
            index,
            manifest: manifest_digest,
        })
    }
}

/// One pull's conversation with one repository.
struct Session<'a> {
    client: &'a RegistryClient,
    registry: String,
    repository: String,
    base: String,
    auth: Auth,
    tried_auth: bool,
    /// This pull's own credentials ([`RegistryClient::pull_as`]).
    credentials: Option<Credentials>,
}

impl Session<'_> {
    fn http_err(url: &str, e: &reqwest::Error) -> PullError {
        PullError::Http {
            url: url.to_string(),
            detail: chain(e),
        }
    }

    fn auth_err(&self, problem: impl Into<String>, fix: &'static str) -> PullError {
        PullError::Auth {
            registry: self.registry.clone(),
            problem: problem.into(),
            fix,
        }
    }

    /// GETs `url`, answering one 401 with the challenge's scheme.
    async fn get(
        &mut self,
        url: &str,
        accept: Option<&str>,
    ) -> Result<reqwest::Response, PullError> {
        loop {
            let mut request = self.client.http.get(url);
            if let Some(accept) = accept {
                request = request.header(reqwest::header::ACCEPT, accept);
            }
            request = match &self.auth {
                Auth::None => request,
                Auth::Bearer(token) => request.bearer_auth(token),
                Auth::Basic(c) => request.basic_auth(&c.username, Some(&c.password)),
            };
            let response = request.send().await.map_err(|e| Self::http_err(url, &e))?;
            let status = response.status();
            if status == reqwest::StatusCode::UNAUTHORIZED && !self.tried_auth {
                self.tried_auth = true;
                let header = response
                    .headers()
                    .get(reqwest::header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                self.authenticate(&header).await?;
                continue;
            }
            if !status.is_success() {
                return Err(PullError::Status {
                    url: url.to_string(),
                    status: status.as_u16(),
                    hint: status_hint(status.as_u16()),
                });
            }
            return Ok(response);
        }
    }

    async fn authenticate(&mut self, header: &str) -> Result<(), PullError> {
        let credentials = self
            .credentials
            .clone()
            .or_else(|| self.client.options.credentials.get(&self.registry).cloned());
        let Some(challenge) = parse_challenge(header) else {
            return Err(self.auth_err(
                format!("asks for authentication with an unreadable challenge {header:?}"),
                "check the registry's address",
            ));
        };
        match challenge.scheme.as_str() {
            "basic" => match credentials {
                Some(c) => {
                    self.auth = Auth::Basic(c);
                    Ok(())
                }
                None => Err(self.auth_err(
                    "asks for a user name and password",
                    "configure credentials for this registry",
                )),
            },
            "bearer" => {
                let token = self.token(&challenge, credentials.as_ref()).await?;
                self.auth = Auth::Bearer(token);
                Ok(())
            }
            other => Err(self.auth_err(
                format!("asks for authentication scheme {other:?}"),
                "use a registry that offers Bearer tokens or Basic auth",
            )),
        }
    }

    async fn token(
        &self,
        challenge: &Challenge,
        credentials: Option<&Credentials>,
    ) -> Result<String, PullError> {
        let Some(realm) = challenge.params.get("realm") else {
            return Err(self.auth_err(
                "sent a Bearer challenge without a realm",
                "check the registry's address",
            ));
        };
        let mut url = reqwest::Url::parse(realm).map_err(|e| {
            self.auth_err(
                format!("token realm {realm:?} is not a URL: {e}"),
                "check the registry",
            )
        })?;
        let realm_host = match (url.host_str(), url.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => String::new(),
        };
        let plain_ok = self.client.plain_http_allowed(&realm_host)
            || self.client.plain_http_allowed(&self.registry) && realm_host == self.registry;
        if url.scheme() != "https" && !(url.scheme() == "http" && plain_ok) {
            return Err(self.auth_err(
                format!("token realm {realm:?} is not https"),
                "serve the token service over https, or list the registry as insecure if it is trusted",
            ));
        }
        let scope = challenge
            .params
            .get("scope")
            .cloned()
            .unwrap_or_else(|| format!("repository:{}:pull", self.repository));
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = challenge.params.get("service") {
                query.append_pair("service", service);
            }
            query.append_pair("scope", &scope);
        }
        let mut request = self.client.http.get(url.clone());
        if let Some(c) = credentials {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let url_text = url.to_string();
        let response = request
            .send()
            .await
            .map_err(|e| Self::http_err(&url_text, &e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.auth_err(
                format!(
                    "the token service {url_text} answered HTTP {}",
                    status.as_u16()
                ),
                if credentials.is_some() {
                    "check the registry credentials"
                } else {
                    "the repository may be private: configure credentials for this registry"
                },
            ));
        }
        let body = read_bounded(response, MAX_TOKEN_BYTES as u64, &url_text).await?;
        #[derive(serde::Deserialize)]
        struct TokenReply {
            #[serde(default)]
            token: Option<String>,
            #[serde(default)]
            access_token: Option<String>,
        }
        let reply: TokenReply = serde_json::from_slice(&body).map_err(|e| {
            self.auth_err(
                format!("the token service's answer is not JSON: {e}"),
                "check the registry",
            )
        })?;
        reply
            .token
            .or(reply.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| self.auth_err("the token service sent no token", "check the registry"))
    }

    /// Fetches a manifest into the store: verified against `expected` when
    /// pinned, stored under its bytes' digest otherwise. Returns its
    /// bytes, Content-Type and digest.
    async fn manifest(
        &mut self,
        reference: &str,
        expected: Option<&Digest>,
        what: &str,
        blobs: &BlobStore,
    ) -> Result<(Vec<u8>, Option<String>, Digest), PullError> {
        let url = format!("{}manifests/{reference}", self.base);
        let accept = MANIFEST_ACCEPT.join(", ");
        let response = self.get(&url, Some(&accept)).await?;
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // A manifest asked for by tag is held to the digest the registry
        // announces for it (as containerd does): bytes changed in its
        // storage or on the way are refused, not stored under their own.
        let announced = response
            .headers()
            .get("Docker-Content-Digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| Digest::parse(v.trim()).ok());
        let limit = self.client.options.limits.max_manifest_bytes;
        let what = format!("manifest of {what}");
        // Held in memory (it is parsed next), within its bound as it
        // streams; then checked and stored, or found stored (a warm pull's
        // manifest is the one it had: nothing is written for it).
        let mut bytes = Vec::new();
        stream_into(response, &url, |chunk| {
            if bytes.len() as u64 + chunk.len() as u64 > limit {
                return Err(BlobError::TooLarge {
                    what: what.clone(),
                    limit,
                });
            }
            bytes.extend_from_slice(chunk);
            Ok(())
        })
        .await?;
        let digest = blobs.store_bytes(what, &bytes, expected.cloned().or(announced), limit)?;
        Ok((bytes, content_type, digest))
    }

    async fn blob(
        &mut self,
        descriptor: &Descriptor,
        limit: u64,
        what: &str,
        blobs: &BlobStore,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), PullError> {
        let mut writer = blobs.writer(
            what,
            Some(descriptor.digest.clone()),
            Some(descriptor.size),
            limit,
        )?;
        let url = format!("{}blobs/{}", self.base, descriptor.digest);
        let response = self.get(&url, None).await?;
        if response.content_length().is_some_and(|n| n > limit) {
            return Err(BlobError::TooLarge {
                what: what.to_string(),
                limit,
            }
            .into());
        }
        stream_into(response, &url, |chunk| {
            writer.write_chunk(chunk)?;
            progress(writer.written());
            Ok(())
        })
        .await?;
        writer.finish()?;
        Ok(())
    }
}

/// Feeds a response body to `sink` chunk by chunk.
async fn stream_into(
    mut response: reqwest::Response,
    url: &str,
    mut sink: impl FnMut(&[u8]) -> Result<(), BlobError>,
) -> Result<(), PullError> {
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Session::http_err(url, &e))?
    {
        sink(&chunk)?;
    }
    Ok(())
}

async fn read_bounded(
    response: reqwest::Response,
    limit: u64,
    url: &str,
) -> Result<Vec<u8>, PullError> {
    let mut out = Vec::new();
    stream_into(response, url, |chunk| {
        if out.len() as u64 + chunk.len() as u64 > limit {
            return Err(BlobError::TooLarge {
                what: url.to_string(),
                limit,
            });
        }
        out.extend_from_slice(chunk);
        Ok(())
    })
    .await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::images::manifest::{OCI_INDEX, OCI_MANIFEST};
    use crate::images::store::tests::{test_image, TestImage};
    use crate::images::store::{ImageLimits, ImageStore};
    use crate::images::unpack::tests::{file, raw_tar};
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Request {
        path: String,
        authorization: Option<String>,
    }

    struct Reply {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    }

    fn reply(status: u16, body: &[u8]) -> Reply {
        Reply {
            status,
            headers: vec![],
            body: body.to_vec(),
        }
    }

    type Routes = Arc<dyn Fn(&Request, u16) -> Reply + Send + Sync>;

    /// A registry on 127.0.0.1: one connection per request, HTTP/1.1
    /// written by hand. Returns its port and the paths it was asked for.
    async fn serve(routes: Routes) -> (u16, Arc<Mutex<Vec<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = log.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let routes = routes.clone();
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                        if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                        // A TLS ClientHello: this server speaks only http.
                        if head == [0x16] {
                            seen.lock().unwrap().push("<tls handshake>".to_string());
                            return;
                        }
                    }
                    let text = String::from_utf8_lossy(&head).into_owned();
                    let mut lines = text.split("\r\n");
                    let path = lines
                        .next()
                        .unwrap_or("")
                        .split(' ')
                        .nth(1)
                        .unwrap_or("")
                        .to_string();
                    let authorization = lines
                        .filter_map(|l| l.split_once(':'))
                        .find(|(k, _)| k.eq_ignore_ascii_case("authorization"))
                        .map(|(_, v)| v.trim().to_string());
                    seen.lock().unwrap().push(path.clone());
                    let r = routes(
                        &Request {
                            path,
                            authorization,
                        },
                        port,
                    );
                    let mut out = format!(
                        "HTTP/1.1 {} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                        r.status,
                        r.body.len()
                    );
                    for (k, v) in &r.headers {
                        out.push_str(&format!("{k}: {v}\r\n"));
                    }
                    out.push_str("\r\n");
                    let _ = socket.write_all(out.as_bytes()).await;
                    let _ = socket.write_all(&r.body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        (port, log)
    }

    fn index_for(image: &TestImage) -> Vec<u8> {
        let host = Platform::host();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [
                {"mediaType": OCI_MANIFEST, "digest": Digest::of(b"other").to_string(), "size": 5,
                 "platform": {"os": "linux", "architecture": "s390x-none"}},
                {"mediaType": OCI_MANIFEST, "digest": image.manifest_digest.to_string(),
                 "size": image.manifest.len(), "platform": {"os": "linux", "architecture": host.architecture}},
            ],
        }))
        .unwrap()
    }

    /// A registry holding `image` as `test/img:latest` behind a bearer
    /// token for alice; `tamper` changes the layer bytes it serves.
    fn registry(image: &TestImage, tamper: Option<Vec<u8>>) -> Routes {
        let index = index_for(image);
        let manifest = image.manifest.clone();
        let manifest_digest = image.manifest_digest.clone();
        let blobs: Vec<(Digest, Vec<u8>)> = image.blobs.clone();
        let layer = Digest::of(&image.layers[0]);
        Arc::new(move |req: &Request, port: u16| {
            if req.path.starts_with("/token?") {
                if req.authorization.as_deref() != Some("Basic YWxpY2U6c2VjcmV0") {
                    return reply(401, b"");
                }
                assert!(req.path.contains("service=reg"), "{}", req.path);
                assert!(
                    req.path.contains("scope=repository%3Atest%2Fimg%3Apull"),
                    "{}",
                    req.path
                );
                return reply(200, br#"{"token":"T1","expires_in":300}"#);
            }
            if req.authorization.as_deref() != Some("Bearer T1") {
                return Reply {
                    status: 401,
                    headers: vec![(
                        "WWW-Authenticate".to_string(),
                        format!(
                            "Bearer realm=\"http://127.0.0.1:{port}/token\",service=\"reg\",scope=\"repository:test/img:pull\""
                        ),
                    )],
                    body: vec![],
                };
            }
            let typed = |media_type: &str, body: &[u8]| Reply {
                status: 200,
                headers: vec![("Content-Type".to_string(), media_type.to_string())],
                body: body.to_vec(),
            };
            match req.path.strip_prefix("/v2/test/img/") {
                Some("manifests/latest") => typed(OCI_INDEX, &index),
                Some(p) if p == format!("manifests/{manifest_digest}") => {
                    typed(OCI_MANIFEST, &manifest)
                }
                Some(p) => {
                    let Some(digest) = p.strip_prefix("blobs/") else {
                        return reply(404, b"");
                    };
                    if digest == layer.to_string() {
                        if let Some(t) = &tamper {
                            return reply(200, t);
                        }
                    }
                    match blobs.iter().find(|(d, _)| d.to_string() == digest) {
                        Some((_, b)) => reply(200, b),
                        None => reply(404, b""),
                    }
                }
                None => reply(404, b""),
            }
        })
    }

    /// A client that may reach the test server on `port` over plain http
    /// (listed as insecure, as the admin lists a loopback registry).
    fn anonymous_client(port: u16, limits: FetchLimits) -> RegistryClient {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let options = RegistryOptions {
            insecure: [format!("127.0.0.1:{port}"), format!("localhost:{port}")].into(),
            limits,
            ..RegistryOptions::default()
        };
        RegistryClient::with_client(http, options)
    }

    /// [`anonymous_client`], with alice's credentials filed under the
    /// server.
    fn client_for(port: u16, limits: FetchLimits) -> RegistryClient {
        let mut c = anonymous_client(port, limits);
        c.options.credentials.insert(
            format!("127.0.0.1:{port}"),
            Credentials {
                username: "alice".to_string(),
                password: "secret".to_string(),
            },
        );
        c
    }

    fn layer() -> Vec<u8> {
        raw_tar(&[file("data/weights.bin", &[7u8; 3000], 0o644)])
    }

    #[tokio::test]
    async fn a_pull_follows_the_token_flow_and_the_index() {
        let image = test_image(&[layer()]);
        let (port, log) = serve(registry(&image, None)).await;
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let reference = ImageReference::parse(&format!("127.0.0.1:{port}/test/img")).unwrap();
        let seen = Mutex::new(Vec::new());
        let progress = |p: &PullProgress| seen.lock().unwrap().push((p.done, p.total));
        let fetched = client_for(port, FetchLimits::default())
            .pull(&reference, store.blobs(), &progress)
            .await
            .unwrap();
        assert_eq!(fetched.manifest, image.manifest_digest);
        assert_eq!(fetched.index, Some(Digest::of(&index_for(&image))));
        assert_eq!(fetched.source, format!("127.0.0.1:{port}/test/img:latest"));
        let total = image.blobs.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        assert_eq!(seen.lock().unwrap().last(), Some(&(total, total)));
        let tokens = log
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.starts_with("/token"))
            .count();
        assert_eq!(tokens, 1);

        let prepared = store.prepare(&fetched, &ImageLimits::default(), 1).unwrap();
        assert_eq!(
            std::fs::read(prepared.rootfs.join("data/weights.bin")).unwrap(),
            vec![7u8; 3000]
        );

        // A second pull finds the blobs and fetches only the manifests.
        log.lock().unwrap().clear();
        let again = client_for(port, FetchLimits::default())
            .pull(&reference, store.blobs(), &|_| {})
            .await
            .unwrap();
        assert_eq!(again.manifest, fetched.manifest);
        assert!(
            log.lock().unwrap().iter().all(|p| !p.contains("/blobs/")),
            "{:?}",
            log.lock().unwrap()
        );

        // Without credentials the token service says no.
        let err = anonymous_client(port, FetchLimits::default())
            .pull(&reference, store.blobs(), &|_| {})
            .await
            .unwrap_err();
        assert!(matches!(&err, PullError::Auth { .. }), "{err}");
        assert!(err.to_string().contains("configure credentials"), "{err}");
    }

    /// A tag's manifest whose bytes are not those the registry announces
    /// (its storage changed under it, or the bytes on the way) is refused
    /// naming both digests, and nothing is stored.
    #[tokio::test]
    async fn a_tag_whose_manifest_is_not_the_announced_digest_is_refused() {
        let image = test_image(&[layer()]);
        let announced = image.manifest_digest.clone();
        let mut changed = image.manifest.clone();
        changed.extend_from_slice(b"\n");
        let served = changed.clone();
        let routes: Routes = Arc::new(move |req: &Request, _| match req.path.as_str() {
            "/v2/test/img/manifests/v1" => Reply {
                status: 200,
                headers: vec![
                    ("Content-Type".to_string(), OCI_MANIFEST.to_string()),
                    ("Docker-Content-Digest".to_string(), announced.to_string()),
                ],
                body: served.clone(),
            },
            _ => reply(404, b""),
        });
        let (port, _) = serve(routes).await;
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let reference = ImageReference::parse(&format!("127.0.0.1:{port}/test/img:v1")).unwrap();
        let err = anonymous_client(port, FetchLimits::default())
            .pull(&reference, store.blobs(), &|_| {})
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&image.manifest_digest.to_string())
                && text.contains(&Digest::of(&changed).to_string()),
            "{text}"
        );
        assert!(!store.blobs().contains(&Digest::of(&changed)));
    }

    /// A loopback port proves nothing about whose server answers: a
    /// registry not listed as insecure is spoken to over https only, so a
    /// local user's plain-http server there never gets a request (nor
    /// credentials), and the error says how to allow a trusted one.
    #[tokio::test]
    async fn a_loopback_registry_not_listed_as_insecure_gets_no_plain_http() {
        let image = test_image(&[layer()]);
        let (port, log) = serve(registry(&image, None)).await;
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let reference = ImageReference::parse(&format!("127.0.0.1:{port}/test/img")).unwrap();
        let mut client = client_for(port, FetchLimits::default());
        client.options.insecure.clear();
        let err = client
            .pull(&reference, store.blobs(), &|_| {})
            .await
            .unwrap_err();
        assert!(matches!(&err, PullError::Http { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("https://127.0.0.1:{port}/")),
            "{text}"
        );
        assert!(text.contains("[images] insecure_registries"), "{text}");
        let asked = log.lock().unwrap().clone();
        assert!(
            !asked.is_empty(),
            "the https attempt never reached the server"
        );
        assert!(asked.iter().all(|p| p == "<tls handshake>"), "{asked:?}");
    }

    #[tokio::test]
    async fn a_tampered_or_oversized_layer_is_refused() {
        let image = test_image(&[layer()]);
        let mut tampered = image.layers[0].clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 0x55;
        let (port, _) = serve(registry(&image, Some(tampered.clone()))).await;
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let reference =
            ImageReference::parse(&format!("127.0.0.1:{port}/test/img:latest")).unwrap();
        let err = client_for(port, FetchLimits::default())
            .pull(&reference, store.blobs(), &|_| {})
            .await
            .unwrap_err();
        let expected = Digest::of(&image.layers[0]);
        let text = err.to_string();
        assert!(
            matches!(err, PullError::Blob(BlobError::DigestMismatch { .. })),
            "{text}"
        );
        assert!(
            text.contains(&expected.to_string())
                && text.contains(&Digest::of(&tampered).to_string()),
            "{text}"
        );
        assert!(!store.blobs().contains(&expected));
        assert_eq!(
            std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
            0
        );

        let small = FetchLimits {
            max_layer_bytes: 100,
            ..FetchLimits::default()
        };
        let err = client_for(port, small)
            .pull(&reference, store.blobs(), &|_| {})
            .await
            .unwrap_err();
        assert!(
            matches!(err, PullError::Blob(BlobError::TooLarge { limit: 100, .. })),
            "{err}"
        );

        // Pinned by a digest the registry does not serve under that name.
        let wrong = Digest::of(b"not the manifest");
        let pinned = ImageReference::parse(&format!("127.0.0.1:{port}/test/img@{wrong}")).unwrap();
        let err = client_for(port, FetchLimits::default())
            .pull(&pinned, store.blobs(), &|_| {})
            .await
            .unwrap_err();
        assert!(
            matches!(err, PullError::Status { status: 404, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_plain_http_token_realm_elsewhere_is_refused() {
        let routes: Routes = Arc::new(|_: &Request, _| Reply {
            status: 401,
            headers: vec![(
                "WWW-Authenticate".to_string(),
                "Bearer realm=\"http://auth.example.invalid/token\",service=\"x\"".to_string(),
            )],
            body: vec![],
        });
        let (port, log) = serve(routes).await;
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let reference = ImageReference::parse(&format!("localhost:{port}/a/b")).unwrap();
        let err = client_for(port, FetchLimits::default())
            .pull(&reference, store.blobs(), &|_| {})
            .await
            .unwrap_err();
        assert!(err.to_string().contains("is not https"), "{err}");
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[test]
    fn challenges_are_read() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.docker.io/token");
        assert_eq!(c.params["scope"], "repository:a/b:pull,push");
        let c = parse_challenge(r#"Basic realm="x \"q\"", charset=UTF-8"#).unwrap();
        assert_eq!(
            (c.scheme.as_str(), c.params["realm"].as_str()),
            ("basic", "x \"q\"")
        );
        assert_eq!(c.params["charset"], "UTF-8");
        assert!(parse_challenge(r#"Bearer realm="unterminated"#).is_none());
        let debug = format!(
            "{:?}",
            Credentials {
                username: "u".into(),
                password: "hunter2".into()
            }
        );
        assert!(!debug.contains("hunter2"));
    }
}
