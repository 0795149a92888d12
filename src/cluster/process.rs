//! `graphloom cluster scheduler` and `graphloom cluster executor`: Ballista's
//! scheduler and executor with graphloom's codec and object stores.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ballista_core::config::TaskSchedulingPolicy;
use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
use ballista_scheduler::cluster::BallistaCluster;
use ballista_scheduler::config::SchedulerConfig;
use ballista_scheduler::scheduler_process::start_server;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::prelude::SessionConfig;

use super::codec::{LogicalCodec, PhysicalCodec};
use super::stores::EnvObjectStores;
use super::{ClusterError, Result};

/// How `graphloom cluster scheduler` runs.
#[derive(Debug, Clone)]
pub struct SchedulerOptions {
    /// Address the gRPC service listens on (also what executors are told
    /// to call back, so it must be reachable from them).
    pub bind: SocketAddr,
    /// An executor silent this long is taken as lost: its running tasks
    /// and the shuffle output it held are scheduled again elsewhere. At
    /// least [`MIN_EXECUTOR_TIMEOUT`]: a busy executor reports every 5 s.
    pub executor_timeout: Duration,
    /// How often lost executors are looked for.
    pub expire_interval: Duration,
    /// How often a failing task is retried before its query fails.
    pub task_max_failures: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            bind: SocketAddr::from(([127, 0, 0, 1], 50050)),
            executor_timeout: Duration::from_secs(180),
            expire_interval: Duration::from_secs(15),
            task_max_failures: 4,
        }
    }
}

/// How `graphloom cluster executor` runs.
#[derive(Debug, Clone)]
pub struct ExecutorOptions {
    /// The scheduler's host and port.
    pub scheduler: super::ClusterUrl,
    /// Address the executor's two services listen on.
    pub bind_host: String,
    /// Host the scheduler and other executors reach this one at (default:
    /// `bind_host`).
    pub external_host: Option<String>,
    /// Arrow Flight port: shuffle data and results are fetched here.
    pub flight_port: u16,
    /// gRPC port, registered with the scheduler (the executor fetches its
    /// tasks: pull scheduling).
    pub grpc_port: u16,
    /// Where shuffle files are written (created if missing).
    pub work_dir: PathBuf,
    /// Tasks run at once (default: the number of cores).
    pub concurrent_tasks: usize,
}

fn process_err(
    process: &'static str,
) -> impl FnOnce(ballista_core::error::BallistaError) -> ClusterError {
    move |e| ClusterError::Process {
        process,
        message: e.to_string(),
    }
}

/// The runtime every cluster process plans and reads with: object stores
/// from the environment, spill files under `temp_dir` when given.
fn runtime(temp_dir: Option<&str>) -> datafusion::error::Result<Arc<RuntimeEnv>> {
    let mut builder =
        RuntimeEnvBuilder::new().with_object_store_registry(Arc::new(EnvObjectStores::default()));
    if let Some(dir) = temp_dir {
        builder = builder.with_temp_file_path(dir);
    }
    builder.build_arc()
}

/// Runs a scheduler until Ctrl-C or SIGTERM.
pub async fn run_scheduler(options: SchedulerOptions) -> Result<()> {
    // The scheduler plans every query: it needs the object stores (a
    // listing table reads file metadata while planning) and the codec (it
    // decodes the client's plan and encodes the executors' tasks).
    let env = runtime(None).map_err(|source| ClusterError::DataFusion {
        step: "building the scheduler's runtime",
        source,
    })?;
    let session_builder: ballista_scheduler::SessionBuilder =
        Arc::new(move |config: SessionConfig| {
            let base = ballista_core::utils::default_session_builder(config)?;
            Ok(SessionStateBuilder::new_from_existing(base)
                .with_runtime_env(env.clone())
                .build())
        });
    if options.executor_timeout < MIN_EXECUTOR_TIMEOUT {
        return Err(ClusterError::Config(format!(
            "the executor timeout must be at least {} s (a busy executor reports every 5 s), got {} s",
            MIN_EXECUTOR_TIMEOUT.as_secs(),
            options.executor_timeout.as_secs()
        )));
    }
    let mut config = SchedulerConfig::default()
        .with_hostname(options.bind.ip().to_string())
        .with_port(options.bind.port())
        .with_scheduler_policy(SCHEDULING)
        .with_override_session_builder(session_builder);
    config.bind_host = options.bind.ip().to_string();
    config.override_logical_codec = Some(Arc::new(LogicalCodec::default()));
    config.override_physical_codec = Some(Arc::new(PhysicalCodec::default()));
    config.executor_timeout_seconds = options.executor_timeout.as_secs().max(1);
    config.expire_dead_executor_interval_seconds = options.expire_interval.as_secs().max(1);
    // A query waits for executors as long as it would for a lost one.
    config.no_executors_grace_period_seconds = config.executor_timeout_seconds;
    config.task_max_failures = options.task_max_failures.max(1);
    let cluster = BallistaCluster::new_from_config(&config)
        .await
        .map_err(process_err("the scheduler"))?;
    tracing::info!(address = %options.bind, "scheduler listening");
    tokio::select! {
        r = start_server(cluster, options.bind, Arc::new(config)) => r.map_err(process_err("the scheduler")),
        _ = shutdown_signal() => Ok(()),
    }
}

/// How tasks reach executors: they ask for work when they have a free
/// slot (every 50 ms while idle). With Ballista 55's push scheduling, a
/// task reset because its executor was lost while a task was being sent
/// to it was never offered again, and the query waited forever (3 of 6
/// runs of the executor-kill test); an idle executor that polls picks it
/// up.
const SCHEDULING: TaskSchedulingPolicy = TaskSchedulingPolicy::PullStaged;

/// The shortest executor timeout the scheduler takes: with
/// [`SCHEDULING`], an executor busy with tasks asks for work, and so says
/// it is alive, every 5 s (Ballista's poll loop).
pub const MIN_EXECUTOR_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs an executor until Ctrl-C, SIGTERM or the scheduler stops it. It
/// registers with the scheduler (retrying for 30 s while it starts).
pub async fn run_executor(options: ExecutorOptions) -> Result<()> {
    if options.flight_port == options.grpc_port {
        return Err(ClusterError::Config(format!(
            "the executor's Flight and gRPC ports must differ (both are {})",
            options.flight_port
        )));
    }
    if options.flight_port == 0 || options.grpc_port == 0 {
        return Err(ClusterError::Config(
            "the executor's ports must be given (the scheduler is told them, so 0 cannot work)"
                .to_string(),
        ));
    }
    std::fs::create_dir_all(&options.work_dir).map_err(|source| ClusterError::Io {
        what: "the executor's work directory",
        path: options.work_dir.display().to_string(),
        source,
    })?;
    let work_dir = options.work_dir.display().to_string();
    let spill_dir = work_dir.clone();
    let runtime_producer: ballista_core::RuntimeProducer =
        Arc::new(move |_: &SessionConfig| runtime(Some(&spill_dir)));
    let vcores = if options.concurrent_tasks == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        options.concurrent_tasks
    };
    // Ballista's default executor registry lacks DataFusion's nested
    // functions (`cardinality`, `array_has`, …) that a client plans with;
    // take every function a default DataFusion session has.
    let functions = ballista_core::registry::BallistaFunctionRegistry::from(
        &SessionStateBuilder::new().with_default_features().build(),
    );
    let config = ExecutorProcessConfig {
        bind_host: options.bind_host.clone(),
        external_host: Some(options.external_host.unwrap_or(options.bind_host)),
        port: options.flight_port,
        grpc_port: options.grpc_port,
        scheduler_host: options.scheduler.host,
        scheduler_port: options.scheduler.port,
        scheduler_connect_timeout_seconds: 30,
        vcores,
        work_dir: Some(work_dir),
        override_runtime_producer: Some(runtime_producer),
        override_function_registry: Some(Arc::new(functions)),
        override_logical_codec: Some(Arc::new(LogicalCodec::default())),
        override_physical_codec: Some(Arc::new(PhysicalCodec::default())),
        task_scheduling_policy: SCHEDULING,
        ..Default::default()
    };
    // The executor handles Ctrl-C and SIGTERM itself: it tells the
    // scheduler, drains its tasks and returns.
    start_executor_process(Arc::new(config))
        .await
        .map_err(process_err("the executor"))
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
