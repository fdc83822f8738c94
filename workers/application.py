"""Celery configuration, from leafpool's settings (environment variables only)."""

from __future__ import annotations

from datetime import timedelta

from celery import Celery
from kombu import Queue

from leafpool.core.config import get_settings

SEGMENT_QUEUE = "leafpool.segment"
SNOWFLAKE_QUEUE = "leafpool.snowflake"
CONTROL_QUEUE = "leafpool.control"

SWEEP_ENTRY = "leafpool-sweep"
SYNC_ENTRY = "leafpool-sync-tags"

settings = get_settings()

#: the beat runs the drop watcher (docs/design.md §3.7); the sweep is then its backstop,
#: at the longer LEAFPOOL_WATCH_SWEEP_SECONDS (a Cluster has no watcher: every second)
watching = settings.watch and settings.redis_topology != "cluster"
sweep_seconds = settings.watch_sweep_seconds if watching else settings.sweep_seconds

# amqp: kombu's connection with the fix that keeps a worker up when its broker connection
# breaks under an unacknowledged task (a failover: workers/broker.py, docs/design.md §3.9)
app = Celery("leafpool", broker=settings.broker_url, include=["workers.tasks"],
             amqp="workers.broker:BrokerAMQP")
app.conf.update(
    task_queues=[Queue(SEGMENT_QUEUE), Queue(SNOWFLAKE_QUEUE), Queue(CONTROL_QUEUE)],
    task_default_queue=CONTROL_QUEUE,
    task_routes={
        "leafpool.refill_segment": {"queue": SEGMENT_QUEUE},
        "leafpool.refill_snowflake": {"queue": SNOWFLAKE_QUEUE},
        "leafpool.refill_segments": {"queue": SEGMENT_QUEUE},
        "leafpool.refill_snowflakes": {"queue": SNOWFLAKE_QUEUE},
        "leafpool.sweep": {"queue": CONTROL_QUEUE},
        "leafpool.sync_tags": {"queue": CONTROL_QUEUE},
    },
    # a refill interrupted by a crash is delivered again (every write is fenced)
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    # an unacknowledged task (its worker was killed) is delivered again after the
    # visibility timeout; sweep for such tasks often enough to notice in time
    broker_transport_options={
        "visibility_timeout": settings.visibility_timeout,
        "unacked_restore_interval": max(1, min(10, settings.visibility_timeout // 3)),
        "unacked_restore_throttle": 1,
        **settings.broker_options,  # Sentinel: the master name
        # every broker key and channel under one prefix: the worker role's ACL grants
        # them by that prefix, not the whole of a shared Redis (docs/design.md §1.2)
        "global_keyprefix": f"{settings.broker_key_prefix}:",
    },
    broker_connection_retry_on_startup=True,
    # a worker waits for its broker for as long as it is away (every 0.5 to 2 s:
    # workers/broker.py), rather than exiting after a hundred attempts
    broker_connection_max_retries=None,
    # rediss:// (or Sentinel over TLS): the same CA and client certificate as the pools
    broker_use_ssl=settings.broker_use_ssl,
    task_ignore_result=True,
    # Flower: task events with their arguments and results
    worker_send_task_events=True,
    task_send_sent_event=True,
    task_serializer="json",
    accept_content=["json"],
    beat_scheduler="workers.beat:LockedScheduler",
    beat_schedule={
        SWEEP_ENTRY: {
            "task": "leafpool.sweep",
            "schedule": timedelta(seconds=sweep_seconds),
            # one interval (5 s at least): sweeps that waited longer in a busy queue are
            # dropped, not run one after another (and one runs at a time: the sweep lock)
            "options": {"expires": max(sweep_seconds, 5)},
        },
        SYNC_ENTRY: {
            "task": "leafpool.sync_tags",
            "schedule": timedelta(seconds=settings.tag_sync_seconds),
            "options": {"expires": settings.tag_sync_seconds},
        },
    },
)
