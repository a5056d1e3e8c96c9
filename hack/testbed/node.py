"""A real single-node Kubernetes cluster: containerd and runc, the CNI bridge plugin, kubelet, kube-proxy,
kube-scheduler, kube-controller-manager and CoreDNS, with the images built here (hack/images.sh).

Everything is the real component, started as processes of the test bed; nothing is pulled from a registry.
The node gets an address of its own, so pods reach the API server through the `kubernetes`
Service (kube-proxy's iptables rules) as they do on any cluster. Teardown stops the containers, unmounts
what the kubelet mounted, removes the bridge, the node's address and kube-proxy's rules.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .process import REPO, ManagedProcess, TestbedError, cache_dir, cached, free_port, k8s_part, versions
from .servers import Etcd, KubeApiServer

NODE_NAME = "chsink-node"
NODE_IP = "10.245.0.1"  # on the loopback link (no dummy links here); pods reach it through the bridge's gateway
BRIDGE = "chsink0"
POD_CIDR = "10.244.0.0/16"
POD_SUBNET = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
DNS_IP = "10.96.0.10"
PAUSE_IMAGE = "chsink.local/pause:3.10"


def _run(*cmd: str, check: bool = True, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)
    if check and res.returncode != 0:
        raise TestbedError(f"{' '.join(cmd)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res


def node_bin(name: str) -> str:
    return str(cached(k8s_part("k8s-node")) / "bin" / name)


class Containerd(ManagedProcess):
    """Debian's containerd with runc, the overlayfs snapshotter and the CNI bridge; its own socket and dirs."""

    name = "containerd"

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd.sock"

    def prepare(self) -> None:
        if not shutil.which("containerd") or not shutil.which("runc"):
            raise TestbedError("containerd/runc missing (Debian packages): run `make setup`")
        cni = self.workdir / "cni"
        cni.mkdir(exist_ok=True)
        (cni / "10-chsink.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "chsink",
            "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(self.workdir / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }))
        (self.workdir / "config.toml").write_text(f"""version = 2
root = "{self.workdir / 'root'}"
state = "{self.workdir / 'state'}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # The kubelet asks for negative OOM scores (-998 for the sandbox), which root of a nested machine may not set.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
""")

    def command(self) -> list[str]:
        return ["containerd", "--config", str(self.workdir / "config.toml")]

    def ready(self) -> bool:
        return self.ctr("version", check=False).returncode == 0

    def ctr(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return _run("ctr", "-a", str(self.socket), "-n", "k8s.io", *args, check=check, timeout=timeout)

    def images(self) -> set[str]:
        return {line.split()[0] for line in self.ctr("images", "ls", "-q").stdout.splitlines() if line.strip()}

    def load(self, images: list[str]) -> None:
        """Copies images from buildah's store (where hack/images.sh built them) into containerd, through one OCI
        layout on disk: a layer several images share (the Debian root, the JRE and Spark) is written and
        imported once, and layers stay uncompressed (compressing them would cost more than it saves here)."""
        todo = [i for i in dict.fromkeys(images) if i not in self.images()]
        if not todo:
            return
        layout = self.workdir / "import"
        shutil.rmtree(layout, ignore_errors=True)
        env = dict(os.environ, TMPDIR=str(self.workdir))  # buildah's scratch files: next to the layout
        for image in todo:
            _run(*buildah(), "push", "-q", "--disable-compression", image, f"oci:{layout}:{image}", timeout=600,
                 env=env)
        with subprocess.Popen(["tar", "-C", str(layout), "-cf", "-", "."], stdout=subprocess.PIPE) as tar:
            res = subprocess.run(["ctr", "-a", str(self.socket), "-n", "k8s.io", "images", "import", "-"],
                                 stdin=tar.stdout, capture_output=True, text=True, timeout=900)
        shutil.rmtree(layout, ignore_errors=True)
        if res.returncode != 0 or tar.returncode != 0:
            raise TestbedError(f"importing {todo} into containerd failed: {res.stderr.strip()}")
        missing = set(todo) - self.images()
        if missing:
            raise TestbedError(f"containerd did not take {sorted(missing)}: {res.stdout.strip()}")

    def kill_containers(self) -> None:
        """Kills every task (the shims outlive containerd, in sessions of their own) and removes them."""
        res = self.ctr("tasks", "ls", "-q", check=False)
        for task in res.stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False, timeout=30)
        time.sleep(0.5)
        for task in res.stdout.split():
            self.ctr("tasks", "delete", "-f", task, check=False, timeout=30)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is not None:
            self.kill_containers()
        super().stop(timeout)
        # Shims of containers that were not killed (a crashed session) are found by their socket.
        res = _run("pgrep", "-f", f"containerd-shim-runc-v2.*{self.socket}", check=False)
        for pid in res.stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        unmount_under(self.workdir)  # sandboxes' /dev/shm, containers' root filesystems
        netns = Path("/var/run/netns")  # the pods' network namespaces, which the CRI plugin names cni-*
        for ns in netns.glob("cni-*") if netns.exists() else []:
            _run("umount", str(ns), check=False)
            ns.unlink(missing_ok=True)


def unmount_under(path: Path) -> None:
    """Lazily unmounts everything mounted below `path`, deepest first, so the directory can be removed."""
    root = str(path)
    mounts = [m.split()[1] for m in Path("/proc/mounts").read_text().splitlines() if m.split()[1].startswith(root)]
    for m in sorted(mounts, key=len, reverse=True):
        _run("umount", "-l", m, check=False)


def coredns_image() -> str:
    return f"chsink.local/coredns:{versions()['COREDNS_VERSION']}"


def buildah() -> list[str]:
    cache = cache_dir()
    return ["buildah", "--root", str(cache / "buildah" / "root"), "--runroot", str(cache / "buildah" / "run"),
            "--storage-driver", "overlay"]


class Kubelet(ManagedProcess):
    """The kubelet on cgroup v1 (cgroupfs driver), registering the node with the admin token."""

    name = "kubelet"

    def __init__(self, workdir: Path, api: KubeApiServer, containerd: Containerd) -> None:
        super().__init__(workdir)
        self.api = api
        self.containerd = containerd
        self.port = free_port(NODE_IP)
        self.healthz_port = free_port()

    def prepare(self) -> None:
        (self.workdir / "resolv.conf").write_text("nameserver 127.0.0.53\n")  # pods of dnsPolicy Default only
        (self.workdir / "config.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{self.containerd.socket}",
            "address": NODE_IP, "port": self.port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDNS": [DNS_IP], "clusterDomain": "cluster.local", "resolvConf": str(self.workdir / "resolv.conf"),
            "failSwapOn": False, "serializeImagePulls": False, "maxPods": 60,
            # Images cannot be pulled again: never collect them, never evict for disk.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "localStorageCapacityIsolation": False,
            "podLogsDir": str(self.workdir / "pod-logs"), "podCIDR": POD_SUBNET,
            "syncFrequency": "5s", "fileCheckFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s", "shutdownGracePeriod": "0s",
        }))

    def command(self) -> list[str]:
        return [node_bin("kubelet"), f"--config={self.workdir / 'config.yaml'}",
                f"--kubeconfig={self.api.kubeconfig}", f"--root-dir={self.workdir / 'root'}",
                f"--cert-dir={self.workdir / 'pki'}", f"--hostname-override={NODE_NAME}", f"--node-ip={NODE_IP}",
                "--v=1"]

    def ready(self) -> bool:
        path = '{.status.conditions[?(@.type=="Ready")].status}'
        res = self.api.run_kubectl("get", "node", NODE_NAME, "-o", f"jsonpath={path}", check=False)
        return res.stdout == "True"

    def stop(self, timeout: float = 15.0) -> None:
        super().stop(timeout)
        unmount_under(self.workdir)  # volumes it mounted (tmpfs secrets, projected tokens) stay mounted


class ControlPlaneProcess(ManagedProcess):
    """kube-scheduler, kube-controller-manager or kube-proxy: one binary, the admin kubeconfig, a health port."""

    def __init__(self, workdir: Path, api: KubeApiServer, binary: str, args: list[str]) -> None:
        self.name = binary
        super().__init__(workdir)
        self.api = api
        self.args = args
        self.health_port = free_port()

    def command(self) -> list[str]:
        return [node_bin(self.name), f"--kubeconfig={self.api.kubeconfig}",
                *[a.replace("{port}", str(self.health_port)) for a in self.args]]

    def ready(self) -> bool:
        import ssl
        import urllib.request

        scheme = "http" if self.name == "kube-proxy" else "https"
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{self.health_port}/healthz", timeout=2,
                                    context=ctx if scheme == "https" else None) as r:
            return bool(r.status == 200)  # kube-proxy answers JSON, the others "ok"


def _host_network_up() -> None:
    """The node's address: the API server and kubelet listen there, and pods reach it, unlike 127.0.0.1."""
    _host_network_down()
    _run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
    # Pod-to-Service traffic between pods of one bridge goes through iptables only with this on.
    Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1\n")
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")


def _host_network_down() -> None:
    _run("ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo", check=False)
    _run("ip", "link", "del", BRIDGE, check=False)


def _kube_proxy_cleanup() -> None:
    """Removes the iptables chains kube-proxy, the kubelet and the CNI bridge plugin added (KUBE-*, CNI-*)."""
    _run(node_bin("kube-proxy"), "--cleanup", check=False)
    for table in ("nat", "filter", "mangle"):
        rules = _run("iptables-save", "-t", table, check=False).stdout
        ours = set(re.findall(r"^:((?:KUBE|CNI)-[\w-]+)", rules, re.M))
        for rule in rules.splitlines():
            words = shlex.split(rule)
            if words[:1] == ["-A"] and words[1] not in ours and "-j" in words and words[words.index("-j") + 1] in ours:
                _run("iptables", "-t", table, "-D", *words[1:], check=False)
        for chain in ours:
            _run("iptables", "-t", table, "-F", chain, check=False)
        for chain in ours:
            _run("iptables", "-t", table, "-X", chain, check=False)


class Cluster:
    """The whole single-node cluster, started in dependency order and stopped in reverse."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.etcd = Etcd(workdir / "etcd")
        self.api = KubeApiServer(workdir / "apiserver", self.etcd, host=NODE_IP, service_cidr=SERVICE_CIDR,
                                 pods=True)
        self.containerd = Containerd(workdir / "containerd")
        self.kubelet = Kubelet(workdir / "kubelet", self.api, self.containerd)
        sa_key = self.api.workdir / "sa.key"
        self.controller_manager = ControlPlaneProcess(workdir / "controller-manager", self.api,
            "kube-controller-manager",
            [f"--service-account-private-key-file={sa_key}", "--use-service-account-credentials=false",
             f"--root-ca-file={self.api.workdir / 'certs' / 'apiserver.crt'}", "--leader-elect=false",
             "--bind-address=127.0.0.1", "--secure-port={port}", f"--cluster-cidr={POD_CIDR}",
             f"--service-cluster-ip-range={SERVICE_CIDR}", "--node-monitor-grace-period=20s",
             "--concurrent-gc-syncs=5"])
        self.scheduler = ControlPlaneProcess(workdir / "scheduler", self.api, "kube-scheduler",
            ["--leader-elect=false", "--bind-address=127.0.0.1", "--secure-port={port}"])
        self.proxy = ControlPlaneProcess(workdir / "kube-proxy", self.api, "kube-proxy",
            [f"--hostname-override={NODE_NAME}", f"--cluster-cidr={POD_CIDR}", "--proxy-mode=iptables",
             "--healthz-bind-address=127.0.0.1:{port}", f"--metrics-bind-address=127.0.0.1:{free_port()}",
             "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-close-wait=0s"])
        self._started: list[ManagedProcess] = []
        self.images: list[str] = []

    def kubectl(self, *args: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.api.run_kubectl(*args, **kw)  # type: ignore[arg-type]

    def run_pod(self, name: str, image: str, *command: str, namespace: str = "default",
                overrides: dict[str, Any] | None = None, timeout: float = 300) -> tuple[str, str]:
        """Runs `command` (or what `overrides` gives the pod) in a pod of a local image to its end: (its phase,
        Succeeded or Failed; its output). Not `kubectl run --rm -i`: that attaches after the start, and a
        container that is done by then leaves it nothing to print but the pod's deletion."""
        ns = ("-n", namespace)
        self.kubectl(*ns, "run", name, "--restart=Never", f"--image={image}", "--image-pull-policy=Never",
                     *([f"--overrides={json.dumps(overrides)}"] if overrides else []),
                     *(["--command", "--", *command] if command else []))
        try:
            deadline = time.monotonic() + timeout
            phase = ""
            while phase not in ("Succeeded", "Failed"):
                if time.monotonic() > deadline:
                    raise TestbedError(f"pod {name} still {phase or 'pending'} after {timeout:.0f}s")
                time.sleep(0.5)
                phase = self.kubectl(*ns, "get", "pod", name, "-o", "jsonpath={.status.phase}").stdout.strip()
            return phase, self.kubectl(*ns, "logs", name).stdout
        finally:
            self.kubectl(*ns, "delete", "pod", name, "--wait=false", check=False)

    def helm(self, *args: str, timeout: float = 600) -> str:
        """helm (built by hack/provision.sh) against this cluster, its caches and config in the workdir."""
        exe = cached(f"helm-{versions()['HELM_VERSION']}") / "bin" / "helm"
        home = self.workdir / "helm"
        env = dict(os.environ, KUBECONFIG=str(self.api.kubeconfig), HELM_CACHE_HOME=str(home / "cache"),
                   HELM_CONFIG_HOME=str(home / "config"), HELM_DATA_HOME=str(home / "data"))
        return _run(str(exe), *args, timeout=timeout, env=env).stdout

    def _start(self, proc: ManagedProcess, timeout: float = 90.0) -> None:
        proc.prepare()
        self._started.append(proc)
        proc.start(timeout)

    def load(self, images: list[str]) -> None:
        """Makes images built here available to pods (imagePullPolicy Never: nothing can be pulled)."""
        self.containerd.load(images)
        self.images += [i for i in images if i not in self.images]

    def start(self) -> None:
        t0 = time.monotonic()
        _kube_proxy_cleanup()
        _host_network_up()
        self._start(self.etcd)
        self._start(self.api)
        self._start(self.containerd)
        self.load([PAUSE_IMAGE, coredns_image()])
        self._start(self.controller_manager)
        self._start(self.scheduler)
        self._start(self.kubelet, timeout=120)
        self._start(self.proxy)  # it takes the node's IP from the Node object
        self._dns()
        self.started_in = time.monotonic() - t0

    def _dns(self) -> None:
        manifest = (REPO / "hack" / "images" / "coredns" / "coredns.yaml").read_text()
        manifest = manifest.replace("@IMAGE@", coredns_image())
        self.kubectl("apply", "-f", "-", input=manifest)
        self.kubectl("-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=120s")

    def stop(self) -> None:
        for proc in reversed(self._started):
            with contextlib.suppress(Exception):
                proc.stop()
        self._started.clear()
        _kube_proxy_cleanup()
        _host_network_down()


@contextlib.contextmanager
def cluster(workdir: Path) -> Iterator[Cluster]:
    c = Cluster(workdir)
    try:
        c.start()
        yield c
    finally:
        c.stop()
