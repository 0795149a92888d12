//! `graphloom cluster scheduler|executor`: the processes of a Ballista
//! cluster that runs graphloom's queries (built with `--features cluster`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use graphloom::Error;

/// The subcommands of `graphloom cluster`.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Start a scheduler: it plans each query and hands its tasks to the
    /// executors. Stops on Ctrl-C or SIGTERM.
    Scheduler(SchedulerArgs),
    /// Start an executor that registers with a scheduler and runs its
    /// tasks. Stops on Ctrl-C or SIGTERM after draining its tasks.
    Executor(ExecutorArgs),
}

/// The flags of `graphloom cluster scheduler`.
#[derive(Debug, Args)]
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub struct SchedulerArgs {
    /// Address to listen on; executors are told to call it back, so
    /// give one they reach.
    #[arg(long, default_value = "127.0.0.1:50050", value_name = "HOST:PORT")]
    bind: std::net::SocketAddr,
    /// Seconds without word from an executor after which it counts as
    /// lost and its tasks run elsewhere (at least 10: a busy executor
    /// reports every 5 s).
    #[arg(long, default_value_t = 180, value_name = "SECS")]
    executor_timeout_secs: u64,
    /// Attempts of one task before its query fails.
    #[arg(long, default_value_t = 4, value_name = "N")]
    task_max_failures: usize,
}

/// The flags of `graphloom cluster executor`.
#[derive(Debug, Args)]
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub struct ExecutorArgs {
    /// The scheduler's address.
    #[arg(long, default_value = "127.0.0.1:50050", value_name = "HOST:PORT")]
    scheduler: String,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    bind_host: String,
    /// Host the scheduler and other executors reach this one at
    /// (default: --bind-host).
    #[arg(long, value_name = "HOST")]
    external_host: Option<String>,
    /// Arrow Flight port (shuffle data and results).
    #[arg(long, default_value_t = 50051, value_name = "PORT")]
    flight_port: u16,
    /// gRPC port, registered with the scheduler (tasks are fetched
    /// from the scheduler, not sent here).
    #[arg(long, default_value_t = 50052, value_name = "PORT")]
    grpc_port: u16,
    /// Directory for shuffle files. Default: graphloom-executor-PORT
    /// under the temp dir.
    #[arg(long, value_name = "DIR")]
    work_dir: Option<PathBuf>,
    /// Tasks to run at once (0: one per core).
    #[arg(long, default_value_t = 0, value_name = "N")]
    concurrent_tasks: usize,
}

impl ClusterCommand {
    /// Runs the scheduler or the executor until it is stopped.
    #[cfg(feature = "cluster")]
    pub async fn run(self) -> Result<(), Error> {
        match self {
            ClusterCommand::Scheduler(args) => args.run().await,
            ClusterCommand::Executor(args) => args.run().await,
        }
    }

    /// Without the `cluster` feature the commands only say how to build it.
    #[cfg(not(feature = "cluster"))]
    pub async fn run(self) -> Result<(), Error> {
        Err(graphloom::cluster::ClusterError::NotBuilt.into())
    }
}

#[cfg(feature = "cluster")]
impl SchedulerArgs {
    async fn run(self) -> Result<(), Error> {
        eprintln!(
            "graphloom cluster scheduler listening on df://{}",
            self.bind
        );
        graphloom::cluster::run_scheduler(graphloom::cluster::SchedulerOptions {
            bind: self.bind,
            executor_timeout: std::time::Duration::from_secs(self.executor_timeout_secs),
            // Look for lost executors a few times per timeout.
            expire_interval: std::time::Duration::from_secs(
                (self.executor_timeout_secs / 4).clamp(1, 15),
            ),
            task_max_failures: self.task_max_failures,
        })
        .await?;
        Ok(())
    }
}

#[cfg(feature = "cluster")]
impl ExecutorArgs {
    async fn run(self) -> Result<(), Error> {
        use graphloom::cluster::{ClusterError, ClusterUrl, ExecutorOptions};
        let scheduler = ClusterUrl::from_address(&self.scheduler).map_err(|_| {
            ClusterError::Config(format!("--scheduler `{}` is not HOST:PORT", self.scheduler))
        })?;
        let flight_port = self.flight_port;
        let work_dir = self.work_dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("graphloom-executor-{flight_port}"))
        });
        eprintln!(
            "graphloom cluster executor on {}:{flight_port} (tasks on :{}), scheduler {}:{}, shuffle files in {}",
            self.bind_host,
            self.grpc_port,
            scheduler.host,
            scheduler.port,
            work_dir.display()
        );
        graphloom::cluster::run_executor(ExecutorOptions {
            scheduler,
            bind_host: self.bind_host,
            external_host: self.external_host,
            flight_port,
            grpc_port: self.grpc_port,
            work_dir,
            concurrent_tasks: self.concurrent_tasks,
        })
        .await?;
        Ok(())
    }
}
