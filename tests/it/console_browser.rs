//! The console test harness, shared by every console test (console.rs,
//! console_dlq.rs, console_explore.rs):
//!
//! * [`TestConsole::start`]: an in-process `orderpipe console` on port 0
//!   over a [`TestEnv`] (its own topics and database), with a viewer and an
//!   operator token; [`TestConsole::http`] is a plain HTTP client for
//!   status-code checks (forged POSTs, CSRF).
//! * [`Browser::start`]: headless Chromium from Debian driven through its
//!   own chromedriver (port of its own) with fantoccini; [`Browser::login`]
//!   signs in with a role's token, [`Browser::screenshots`] saves the
//!   current page at desktop (1280x900) and phone (390x844) width to
//!   `target/console-screenshots/<page>-<width>.png`.
//!
//! A machine without chromedriver fails these tests with a message saying
//! how to install it (`dev/stack.sh deps` does, and `make test` runs that):
//! the browser tests never skip silently.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use orderpipe::config::Settings;
use orderpipe::console::{self, ConsoleState, Role};
use secrecy::SecretString;

use crate::helpers::TestEnv;

/// The viewer token of every test console.
pub const VIEWER_TOKEN: &str = "viewer-token-for-tests-0001";
/// The operator token of every test console.
pub const OPERATOR_TOKEN: &str = "operator-token-for-tests-0001";

/// The token of `role`.
pub fn token(role: Role) -> &'static str {
    match role {
        Role::Viewer => VIEWER_TOKEN,
        Role::Operator => OPERATOR_TOKEN,
    }
}

/// A console serving one test's environment.
pub struct TestConsole {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Its state (settings, database).
    pub state: ConsoleState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestConsole {
    /// Starts a console over `env`'s settings with both tokens and
    /// `lag.groups = ["<prefix>.group"]` (listing every group of the shared
    /// broker is slow); `tune` may change any setting first (`console.read_only`,
    /// proxy headers, `lag.groups`).
    pub async fn start(env: &TestEnv, tune: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = env.settings.clone();
        settings.console.listen = "127.0.0.1:0".into();
        settings.console.viewer_token = Some(SecretString::from(VIEWER_TOKEN));
        settings.console.operator_token = Some(SecretString::from(OPERATOR_TOKEN));
        settings.lag.groups = vec![format!("{}.group", env.prefix)];
        tune(&mut settings);
        settings
            .console
            .validate()
            .expect("test console settings are valid");
        let db = orderpipe::db::Db::connect(&settings.database, 4).expect("database settings");
        let state = ConsoleState::new(settings, db).expect("console state");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let serving = state.clone();
        tokio::spawn(async move {
            console::serve(
                "127.0.0.1:0".parse().unwrap(),
                serving,
                move |addr| {
                    let _ = bound_tx.send(addr);
                },
                async move {
                    let _ = stopped.await;
                },
            )
            .await
            .expect("console serves");
        });
        let addr = tokio::time::timeout(Duration::from_secs(10), bound_rx)
            .await
            .expect("console binds in time")
            .unwrap();
        Self {
            url: format!("http://{addr}"),
            state,
            stop: Some(stop),
        }
    }

    /// A plain HTTP client (no redirects followed, no cookies kept).
    pub fn http() -> reqwest::Client {
        reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap()
    }

    /// `GET path` as `role` (bearer token); returns status and body.
    pub async fn get_as(&self, role: Role, path: &str) -> (u16, String) {
        let response = Self::http()
            .get(format!("{}{path}", self.url))
            .bearer_auth(token(role))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// `role`'s CSRF token, read from a page's `<meta name="csrf-token">`.
    pub async fn csrf_of(&self, role: Role) -> String {
        let (status, body) = self.get_as(role, "/audit").await;
        assert_eq!(status, 200, "{body}");
        meta_csrf(&body).expect("every page carries its CSRF token")
    }

    /// `POST path` as `role` with `form` (and `csrf_token` when given).
    pub async fn post_as(
        &self,
        role: Role,
        path: &str,
        csrf: Option<&str>,
        form: &[(&str, &str)],
    ) -> (u16, String) {
        let mut fields: Vec<(&str, &str)> = form.to_vec();
        if let Some(token) = csrf {
            fields.push(("csrf_token", token));
        }
        let response = Self::http()
            .post(format!("{}{path}", self.url))
            .bearer_auth(token(role))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(fields)
                    .finish(),
            )
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }
}

impl Drop for TestConsole {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The content of `<meta name="csrf-token" content="...">`.
pub fn meta_csrf(html: &str) -> Option<String> {
    let start =
        html.find("name=\"csrf-token\" content=\"")? + "name=\"csrf-token\" content=\"".len();
    Some(html[start..].split('"').next()?.to_string())
}

/// Desktop and phone widths of the screenshots.
pub const SCREEN_SIZES: [(u32, u32); 2] = [(1280, 900), (390, 844)];

/// Where screenshots go.
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
}

/// A chromedriver process of one test; killed when dropped.
struct Chromedriver {
    child: Child,
    port: u16,
}

impl Chromedriver {
    fn start() -> Self {
        let binary = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "the console's browser tests need chromedriver and Chromium ({binary}: {e}); install them with \
                     `apt-get install -y chromium chromium-driver` (dev/stack.sh deps does, and make test runs it), \
                     or point CHROMEDRIVER at the binary"
                )
            });
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on port {port} within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless Chromium of one test.
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    /// The console it browses.
    base: String,
    _driver: Chromedriver,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium at desktop size, browsing `console`.
    pub async fn start(console: &TestConsole) -> Self {
        let driver = Chromedriver::start();
        let mut capabilities = serde_json::Map::new();
        let (width, height) = SCREEN_SIZES[0];
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--hide-scrollbars", format!("--window-size={width},{height}")],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
            .expect(
                "a Chromium session through chromedriver (is the `chromium` package installed?)",
            );
        Self {
            client,
            base: console.url.clone(),
            _driver: driver,
        }
    }

    /// Opens `path` of the console.
    pub async fn open(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.base))
            .await
            .unwrap();
    }

    /// Signs in with `role`'s token through the login form; lands on the overview.
    pub async fn login(&self, role: Role) {
        self.open("/login").await;
        self.fill("#token", token(role)).await;
        self.click("form[action='/login'] button[type='submit']")
            .await;
        self.find("header .who").await;
        let who = self.text("header .who").await;
        assert!(who.contains(role.as_str()), "signed in as {role:?}: {who}");
    }

    /// The first element matching `css`, waiting (up to 30 s) for it: after a
    /// click the next page may still be loading, the more so on a busy
    /// machine (a plain `find` failed there once). Panics naming `css` and
    /// what the page shows.
    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        match self.client.wait().for_element(Locator::Css(css)).await {
            Ok(element) => element,
            Err(e) => panic!(
                "{css}: {e}; the page shows: {:?}",
                self.try_text("main").await
            ),
        }
    }

    /// The text of the first element matching `css` (waiting for it, as [`Self::find`]).
    pub async fn text(&self, css: &str) -> String {
        self.find(css).await.text().await.unwrap()
    }

    /// The text of `css` on the current page now, or None (absent, or the page reloads).
    pub async fn try_text(&self, css: &str) -> Option<String> {
        self.client
            .find(Locator::Css(css))
            .await
            .ok()?
            .text()
            .await
            .ok()
    }

    /// The texts of every element matching `css` on the current page (no wait:
    /// call it once the page is known to be there).
    pub async fn texts(&self, css: &str) -> Vec<String> {
        let mut out = Vec::new();
        for e in self.client.find_all(Locator::Css(css)).await.unwrap() {
            out.push(e.text().await.unwrap());
        }
        out
    }

    /// Waits until the text of `css` satisfies `done`; returns it.
    pub async fn wait_text(
        &self,
        css: &str,
        timeout: Duration,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(text) = self.try_text(css).await.filter(|t| done(t)) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{css}: not as expected within {timeout:?}: {:?}; the page shows: {:?}",
                self.try_text(css).await,
                self.try_text("main").await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Clicks the first element matching `css` (waiting for it).
    pub async fn click(&self, css: &str) {
        self.find(css).await.click().await.unwrap();
    }

    /// Replaces the value of the field matching `css` (waiting for it) with `text`.
    pub async fn fill(&self, css: &str, text: &str) {
        let field = self.find(css).await;
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// The POST forms of the page other than sign-out and search (its action forms).
    pub async fn action_forms(&self) -> usize {
        // Every POST form but those any role may send (sign out, search).
        let open: String = orderpipe::console::csrf::ANY_ROLE_POSTS
            .iter()
            .map(|path| format!(":not([action='{path}'])"))
            .collect();
        self.client
            .find_all(Locator::Css(&format!("form[method='post']{open}")))
            .await
            .unwrap()
            .len()
    }

    /// Saves the current page at each of [`SCREEN_SIZES`] as
    /// `target/console-screenshots/<page>-<width>.png`, then restores desktop size.
    pub async fn screenshots(&self, page: &str) {
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap();
        for (width, height) in SCREEN_SIZES {
            self.client.set_window_size(width, height).await.unwrap();
            let inner = self
                .client
                .execute("return window.innerWidth", vec![])
                .await
                .unwrap();
            assert_eq!(
                inner.as_u64(),
                Some(u64::from(width)),
                "the viewport is {width} px wide"
            );
            let png = self.client.screenshot().await.unwrap();
            std::fs::write(dir.join(format!("{page}-{width}.png")), png).unwrap();
        }
        let (width, height) = SCREEN_SIZES[0];
        self.client.set_window_size(width, height).await.unwrap();
    }

    /// Ends the session.
    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}
