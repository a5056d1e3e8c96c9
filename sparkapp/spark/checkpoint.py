"""A checkpoint's files through Hadoop's FileSystem (s3a://, hdfs://, gs://, file:...), for the cleanup Job the
operator starts when a sink with deletionPolicy Delete checkpoints where the operator's pod cannot reach: the job's
image has the file systems' clients, and the Job the driver's credentials."""

from __future__ import annotations

from typing import Any

from ..config import CHECKPOINT_MARKER
from ..edges.checkpoint import delete_checkpoint
from .session import local_driver_conf


class HadoopFiles:
    """CheckpointFiles on the location's Hadoop FileSystem."""

    def __init__(self, spark: Any, location: str) -> None:
        self._jvm = spark._jvm
        self._base = self._jvm.org.apache.hadoop.fs.Path(location.rstrip("/"))
        self._fs = self._base.getFileSystem(spark._jsc.hadoopConfiguration())

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._base, name)

    def marker(self) -> str | None:
        marker = self._path(CHECKPOINT_MARKER)
        if not self._fs.exists(marker):
            return None
        stream = self._fs.open(marker)
        try:
            return bytes(stream.readAllBytes()).decode()
        finally:
            stream.close()

    def names(self) -> list[str]:
        if not self._fs.exists(self._base):
            return []
        return [str(st.getPath().getName()) for st in self._fs.listStatus(self._base)]

    def delete(self, name: str) -> None:
        self._fs.delete(self._path(name), True)

    def remove_location(self) -> None:
        self._fs.delete(self._base, True)  # empty; on an object store a directory may be only its entries' prefix


def delete_with_hadoop(location: str, sink: str, conf: dict[str, str]) -> str:
    """Deletes the checkpoint as delete_checkpoint() decides, in a local Spark session with `conf` (the sink's
    `spark.hadoop.*` settings: endpoint, path style, credentials provider)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName("chsink-checkpoint-cleanup").master("local[1]")
    for k, v in local_driver_conf("local[1]", {"spark.ui.enabled": "false", **conf}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    try:
        return delete_checkpoint(HadoopFiles(spark, location), location, sink)
    finally:
        spark.stop()
