"""A real one-node Kubernetes cluster on this machine, for the tests that need pods: the chart installed as
its README says, probes, Services, the operator as a pod, rolling upgrades.

etcd and kube-apiserver (the control plane the envtest tests use), kube-controller-manager, kube-scheduler,
kubelet and kube-proxy (iptables mode), all built from one ``k8s.io/kubernetes`` module by
``scripts/bootstrap node``; Debian's containerd, runc and CNI plugins (bridge, host-local, loopback); CoreDNS
built from its Go module, as a host process. No registry is needed: the pod sandbox (``tools/pause``) and
the project's image are imported with ``ctr -n k8s.io images import``.

The node changes the host: an address (``10.250.0.1`` on a bridge without ports, as this kernel has no dummy
driver), the CNI bridge and network namespaces, iptables chains (kube-proxy's and the kubelet's ``KUBE-*``,
and one FORWARD rule that keeps pods from routing off the machine), sysctls (``ip_forward``; the kubelet's
``vm.*`` and ``kernel.*`` defaults), ``/kubepods`` cgroups and mounts. Hence: root only, one cluster per
machine at a time (a lock), and a journal of what was changed, written before each change, that ``stop``
replays in reverse and that the next ``start`` replays first if a run died without stopping (SIGKILL).
``python -m tests.node down`` does the same by hand; ``python -m tests.node up`` starts one and waits.

The traps it avoids are in ../shared/notes/real-node.md of the workplace: cgroup v1 (``failCgroupV1:
false``), no CAP_SYS_RESOURCE (``restrict_oom_score_adj``), a kubelet that exits if containerd's CRI is not
ready, an API server that must advertise an address pods reach.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cryptography import x509

from workflow_streams.local import cache_bin
from workflow_streams.local.kube import AUDIENCE, ControlPlane
from workflow_streams.local.postgres import LocalPostgres, free_port
from workflow_streams.local.process import Process, http_ok, wait_until

NODE_IP = "10.250.0.1"
NODE_NAME = "wfs-node"
POD_CIDR = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
SERVICE_CIDR = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
HOST_LINK = "wfsnode0"  # carries NODE_IP and the route to the Service range
CNI_BRIDGE = "wfscni0"  # the pods' bridge, made by the bridge CNI plugin
API_PORT = 6443
PAUSE_IMAGE = "localhost/wfs-pause:1"
STATE = Path("/run/wfs-node")  # the lock and the journal: tmpfs, gone with the host changes at a reboot
# kubelet (protectKernelDefaults: false) sets the first four; ip_forward is set by the bridge plugin
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
)
# paths the kubelet, containerd and libcni use whatever they are told (device plugins, the kubelet's
# /var/log/containers links, CNI results, shim sockets), and kubectl's discovery cache of this API server:
# removed at the end when the node made them
HOST_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/lib/cni"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/run/containerd"),
    Path.home() / ".kube" / "cache" / "discovery" / f"{NODE_IP}_{API_PORT}",
)
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "coredns")
CHAIN_PREFIXES = ("KUBE-", "CNI-")


# what the node tests measured (install to Ready, rollout counts), printed at the end of the run by
# tests/conftest.py: reported, never asserted on time
FIGURES: list[str] = []


class NodeUnavailable(RuntimeError):
    """The node cannot run here (not root, or a part is missing); the message says which and how to fix it."""


def why_unavailable() -> str | None:
    """None when a node can start here, else why not."""
    if os.geteuid() != 0:
        return "the one-node cluster needs root (network links, iptables, cgroups, mounts)"
    missing = [name for name in BINARIES if not (cache_bin() / name).is_file()]
    if not (cache_bin() / "wfs-pause").is_file():
        missing.append("wfs-pause")
    if missing:
        return f"not built: {', '.join(missing)} (scripts/bootstrap node builds them)"
    for tool in ("containerd", "ctr", "runc", "iptables", "ip", "kubectl"):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} is not installed (scripts/bootstrap node installs Debian's containerd, runc, CNI plugins)"
    if not Path("/usr/lib/cni/bridge").is_file():
        return "the CNI plugins are not installed (scripts/bootstrap node: containernetworking-plugins)"
    return None


def run(
    *args: str, check: bool = True, timeout: float = 60, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, input=input)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
    return result


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str | None:
    try:
        return sysctl_path(name).read_text().strip()
    except OSError:
        return None


def default_interface() -> str | None:
    match = re.search(r"\bdev (\S+)", run("ip", "route", "show", "default", check=False).stdout)
    return match[1] if match else None


def pause_image_tar(binary: Path, out: Path, name: str = PAUSE_IMAGE) -> Path:
    """A one-layer docker-archive (what ``docker save`` writes) holding ``binary`` as ``/pause``."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = binary.stat().st_size, 0o755, 0
        with binary.open("rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": {"Entrypoint": ["/pause"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        },
        sort_keys=True,
    ).encode()
    config_id = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": f"{config_id}.json", "RepoTags": [name], "Layers": [f"{diff_id}/layer.tar"]}])
    with tarfile.open(out, "w") as tar:
        for member, data in (
            (f"{config_id}.json", config),
            (f"{diff_id}/layer.tar", layer_bytes),
            ("manifest.json", manifest.encode()),
        ):
            info = tarfile.TarInfo(member)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return out


class Journal:
    """What the node changed on the host, written before each change (so a crash leaves a true record)."""

    path = STATE / "journal.json"

    def __init__(self, data: dict[str, Any] | None = None) -> None:
        self.data: dict[str, Any] = data or {"dir": None}
        for key, empty in (("sysctls", {}), ("links", []), ("forward_rule", None), ("created_paths", [])):
            self.data.setdefault(key, empty)
        self.data.setdefault("nft_tables", None)

    @classmethod
    def load(cls) -> Journal | None:
        try:
            return cls(json.loads(cls.path.read_text()))
        except (OSError, ValueError):
            return None

    def save(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class NodeCluster(ControlPlane):
    """The same interface as the envtest ``ControlPlane`` (kubectl, kubeconfig, ``dir`` with ``ca.crt`` and
    ``sa.key``), on a cluster that runs pods."""

    def __init__(self, directory: Path | None = None) -> None:
        self._lock_file: io.TextIOWrapper | None = None
        super().__init__(directory or Path(tempfile.mkdtemp(prefix="wfs-node-", dir="/var/tmp")))
        self.port = API_PORT
        self.node_ip = NODE_IP
        self.journal = Journal({"dir": str(self.dir)})
        self.timings: dict[str, float] = {}

    @property
    def server(self) -> str:
        return f"https://{NODE_IP}:{API_PORT}"

    @property
    def containerd_socket(self) -> Path:
        return self.dir / "containerd" / "containerd.sock"

    # -- the lock: one cluster per machine

    def _acquire(self, wait: float) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        lock = (STATE / "lock").open("a+")
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    lock.seek(0)
                    holder = lock.read().strip()
                    lock.close()
                    raise NodeUnavailable(
                        f"another one-node cluster holds {STATE / 'lock'} ({holder or 'unknown'}) after {wait:g} s"
                    ) from None
                time.sleep(1)
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} dir {self.dir}\n")
        lock.flush()
        self._lock_file = lock

    def _release(self) -> None:
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    # -- start

    def start(self, lock_wait: float = 1200) -> None:
        reason = why_unavailable()
        if reason:
            raise NodeUnavailable(reason)
        self._acquire(lock_wait)
        try:
            left = Journal.load()
            if left is not None:  # a run that died without stopping: undo what it did first
                restore(left)
            self.journal.save()
            started = time.monotonic()
            self._host()
            self._write_pki()
            self._write_configs()
            self._control_plane()
            self.timings["control plane"] = time.monotonic() - started
            self._node()
            self.timings["node Ready"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    def _host(self) -> None:
        self.journal.data["created_paths"] = [str(p) for p in HOST_PATHS if not p.exists()]
        self.journal.data["nft_tables"] = nft_tables()
        for name in SYSCTLS:
            value = read_sysctl(name)
            if value is not None:
                self.journal.data["sysctls"][name] = value
        self.journal.data["links"] = [HOST_LINK, CNI_BRIDGE]
        interface = default_interface()
        if interface:
            self.journal.data["forward_rule"] = ["-s", "10.244.0.0/16", "-o", interface, "-j", "DROP"]
        self.journal.save()
        if run("ip", "link", "show", HOST_LINK, check=False).returncode != 0:
            run("ip", "link", "add", HOST_LINK, "type", "bridge")
        run("ip", "addr", "replace", f"{NODE_IP}/32", "dev", HOST_LINK)
        run("ip", "link", "set", HOST_LINK, "up")
        run("ip", "route", "replace", SERVICE_CIDR, "dev", HOST_LINK)
        rule = self.journal.data["forward_rule"]
        if rule and run("iptables", "-w", "-C", "FORWARD", *rule, check=False).returncode != 0:
            run("iptables", "-w", "-I", "FORWARD", "1", *rule)

    ca_name = "wfs-node-ca"

    def _server_sans(self) -> list[x509.GeneralName]:
        # pods reach the API server as the kubernetes Service and on the node's address
        names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", AUDIENCE.split("//")[1]]
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
        return sans + [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", NODE_IP, KUBERNETES_SERVICE_IP)]

    def _write_configs(self) -> None:
        import yaml

        d = self.dir
        for sub in ("containerd", "cni/net.d", "kubelet", "pod-logs", "logs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "containerd" / "config.toml").write_text(
            f"""version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{d}/containerd/containerd-ttrpc.sock"
[debug]
  address = "{d}/containerd/debug.sock"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{PAUSE_IMAGE}"
    enable_cdi = false
    # this VM withholds CAP_SYS_RESOURCE: oom_score_adj can not go below the current value
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "{d}/containerd/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{d}/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/containerd/opt"
"""
        )
        conflist = {
            "cniVersion": "1.0.0",
            "name": "wfs-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": CNI_BRIDGE,
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": f"{d}/cni/ipam",
                        "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                    },
                },
                {"type": "loopback"},
            ],
        }
        (d / "cni/net.d/10-wfs-node.conflist").write_text(json.dumps(conflist, indent=1))
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(d / "ca.crt")},
            },
            "authorization": {"mode": "Webhook"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "podLogsDir": str(d / "pod-logs"),
            "clusterDomain": "cluster.local",
            "clusterDNS": [NODE_IP],
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "maxPods": 50,
        }
        (d / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        self.proxy_health_port, self.proxy_metrics_port = free_port(), free_port()
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": "10.244.0.0/16",
            "hostnameOverride": NODE_NAME,
            "bindAddress": NODE_IP,
            "healthzBindAddress": f"127.0.0.1:{self.proxy_health_port}",
            "metricsBindAddress": f"127.0.0.1:{self.proxy_metrics_port}",
            "nodePortAddresses": [f"{NODE_IP}/32"],
            # leave the host's conntrack settings alone
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }
        (d / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))
        self.dns_health_port, self.dns_ready_port = free_port(), free_port()
        (d / "Corefile").write_text(
            f""".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{self.dns_health_port}
    ready 127.0.0.1:{self.dns_ready_port}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    loadbalance
}}
"""
        )

    @property
    def logs_dir(self) -> Path:
        return self.dir / "logs"

    @property
    def named(self) -> dict[str, Process]:
        return {proc.name: proc for proc in self.procs}

    def _control_plane(self) -> None:
        d = self.dir
        self._start_etcd()
        # pods reach the API server on the node's address (the kubernetes Service's endpoint)
        self._start_apiserver(
            address=NODE_IP,
            service_cidr=SERVICE_CIDR,
            authorization="Node,RBAC",
            more=[
                "--kubelet-client-certificate",
                str(d / "admin.crt"),
                "--kubelet-client-key",
                str(d / "admin.key"),
                "--kubelet-preferred-address-types",
                "InternalIP",
            ],
            seconds=180,
        )
        common = [
            "--kubeconfig",
            str(self.kubeconfig),
            "--authentication-kubeconfig",
            str(self.kubeconfig),
            "--authorization-kubeconfig",
            str(self.kubeconfig),
            "--bind-address",
            "127.0.0.1",
            "--leader-elect=false",
        ]
        self._spawn(
            "kube-controller-manager",
            [
                *common,
                "--secure-port",
                str(free_port()),
                "--service-account-private-key-file",
                str(d / "sa.key"),
                "--root-ca-file",
                str(d / "ca.crt"),
                "--use-service-account-credentials=true",
                "--cluster-signing-cert-file",
                str(d / "ca.crt"),
                "--cluster-signing-key-file",
                str(d / "ca.key"),
                "--allocate-node-cidrs=false",
            ],
        )
        self._spawn("kube-scheduler", [*common, "--secure-port", str(free_port())])

    def _node(self) -> None:
        d = self.dir
        containerd = self._spawn(
            "containerd", ["--config", str(d / "containerd" / "config.toml")], binary=shutil.which("containerd")
        )
        # the kubelet exits if containerd's CRI service is not initialised yet
        containerd.wait_for_output("Start streaming server", seconds=60)
        tar = pause_image_tar(cache_bin() / "wfs-pause", d / "pause.tar")
        self.ctr("images", "import", str(tar))
        self._spawn(
            "kubelet",
            [
                "--config",
                str(d / "kubelet.yaml"),
                "--kubeconfig",
                str(self.kubeconfig),
                "--root-dir",
                str(d / "kubelet"),
                "--cert-dir",
                str(d / "kubelet-pki"),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                NODE_IP,
            ],
        )
        self._spawn("kube-proxy", ["--config", str(d / "kube-proxy.yaml")])
        self._spawn("coredns", ["-conf", str(d / "Corefile")])

        def ready() -> bool:
            out = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            conditions = json.loads(out.stdout)["status"].get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

        wait_until(
            ready,
            seconds=180,
            alive=lambda: all(proc.running() for proc in self.procs),
            describe=lambda: "\n".join(proc.tail(1500) for proc in self.procs),
            what="the node",
            interval=0.5,
        )
        wait_until(
            lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0,
            seconds=120,
            what="the default ServiceAccount",
            interval=0.5,
        )
        wait_until(
            lambda: http_ok(f"http://127.0.0.1:{self.dns_ready_port}/ready"),
            seconds=60,
            alive=self.named["coredns"].running,
            describe=self.named["coredns"].tail,
            what="CoreDNS",
        )

    # -- use

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return run("ctr", "--address", str(self.containerd_socket), "-n", "k8s.io", *args, timeout=timeout)

    def import_image(self, archive: Path) -> None:
        """A docker-archive (``podman save --format docker-archive``) into the node's image store."""
        self.ctr("images", "import", str(archive))

    def images(self) -> list[str]:
        return self.ctr("images", "ls", "-q").stdout.split()

    def logs(self) -> str:
        """The tails of every component's log, for a failure message."""
        return "\n".join(proc.tail(3000) for proc in self.procs)

    # -- stop

    def stop(self) -> None:
        """Stop everything and undo every host change; the lock is released last."""
        try:
            try:
                self._drain()
            finally:
                for proc in reversed(self.procs):
                    with contextlib.suppress(Exception):
                        proc.stop(grace=10)
                self.procs.clear()
                restore(self.journal)
        finally:
            self._release()

    def _drain(self) -> None:
        """Pods deleted through the API while the API server and kubelet still run (controllers stopped, so
        nothing recreates them), so the kubelet tears their sandboxes and network down itself."""
        alive = {name for name, proc in self.named.items() if proc.running()}
        if not {"kube-apiserver", "kubelet", "containerd"} <= alive:
            return
        for name in ("kube-controller-manager", "kube-scheduler"):
            self.named[name].stop(grace=5)
        started = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            run(
                *("kubectl", "--kubeconfig", str(self.kubeconfig), "delete", "pods", "--all", "--all-namespaces"),
                *("--grace-period=2", "--wait=false"),
                check=False,
                timeout=30,
            )
        socket = str(self.containerd_socket)
        while time.monotonic() < started + 60:
            if not run("ctr", "--address", socket, "-n", "k8s.io", "tasks", "ls", "-q", check=False).stdout.strip():
                break
            time.sleep(0.5)
        self.timings["drain"] = time.monotonic() - started


def _pids_in(path: Path) -> list[int]:
    pids: list[int] = []
    for procs in path.rglob("cgroup.procs"):
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def _cgroup_roots() -> Iterator[Path]:
    base = Path("/sys/fs/cgroup")
    for hierarchy in [base, *(p for p in base.iterdir() if p.is_dir())]:
        for name in ("kubepods", "kubepods.slice", "k8s.io"):
            if (hierarchy / name).is_dir():
                yield hierarchy / name


def _mounts_under(prefixes: tuple[str, ...]) -> list[str]:
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(prefixes):
            points.append(point)
    return sorted(points, key=len, reverse=True)


def pod_netns() -> list[str]:
    """The network namespaces of our pods: podman's CNI backend names its own ``cni-*`` too, so a namespace
    is ours when its address is in the pod range."""
    ours = []
    pods = ipaddress.ip_network("10.244.0.0/16")
    for line in run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith("cni-"):
            continue
        addresses = run("ip", "-n", name, "-4", "-o", "addr", "show", check=False).stdout
        for found in re.findall(r"inet (\S+)/", addresses):
            if ipaddress.ip_address(found) in pods:
                ours.append(name)
                break
    return ours


def nft_tables() -> list[tuple[str, str]] | None:
    """(family, name) of the nftables tables, or None without the nft command."""
    if shutil.which("nft") is None and not Path("/usr/sbin/nft").exists():
        return None
    listing = run("nft", "list", "tables", check=False).stdout
    return [(parts[1], parts[2]) for parts in (line.split() for line in listing.splitlines()) if len(parts) == 3]


def nft_table_is_empty(family: str, table: str) -> bool:
    """No rule in any of its chains (only the chains' headers and policies)."""
    listing = run("nft", "list", "table", family, table, check=False)
    if listing.returncode != 0:
        return False
    for line in listing.stdout.splitlines():
        text = line.strip()
        if text and not text.startswith(("table ", "chain ", "type ", "policy ", "}")):
            return False
    return True


def _iptables_chains(tool: str) -> dict[str, list[str]]:
    """table -> our chains (KUBE-*, CNI-*) in it."""
    found: dict[str, list[str]] = {}
    for table in ("filter", "nat", "mangle", "raw"):
        listing = run(tool, "-w", "-t", table, "-S", check=False)
        chains = [line.split()[1] for line in listing.stdout.splitlines() if line.startswith("-N ")]
        ours = [c for c in chains if c.startswith(CHAIN_PREFIXES)]
        if ours:
            found[table] = ours
    return found


def _remove_chains(tool: str) -> None:
    for table, chains in _iptables_chains(tool).items():
        rules = run(tool, "-w", "-t", table, "-S", check=False).stdout.splitlines()
        for rule in rules:  # jumps into our chains from the built-in ones
            parts = rule.split()
            if parts[0] == "-A" and not parts[1].startswith(CHAIN_PREFIXES) and "-j" in parts:
                target = parts[parts.index("-j") + 1]
                if target.startswith(CHAIN_PREFIXES):
                    run(tool, "-w", "-t", table, "-D", *parts[1:], check=False)
        for chain in chains:
            run(tool, "-w", "-t", table, "-F", chain, check=False)
        for chain in chains:
            run(tool, "-w", "-t", table, "-X", chain, check=False)


def restore(journal: Journal) -> None:
    """Undo what ``journal`` records, whether or not the processes are still running (idempotent)."""
    data = journal.data
    work = Path(data["dir"]) if data.get("dir") else None
    # processes: the pods' (in our cgroups), containerd's shims, and anything still running from our directory
    for _ in range(3):
        victims = {pid for root in _cgroup_roots() for pid in _pids_in(root)}
        if work is not None:
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                with contextlib.suppress(OSError):
                    text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if str(work) in text and int(cmdline.parent.name) != os.getpid():
                        victims.add(int(cmdline.parent.name))
        if not victims:
            break
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
    # mounts: volumes, overlay snapshots; then the sandboxes' network namespaces
    prefixes = (f"{work}/",) if work is not None else ()
    for point in _mounts_under((*prefixes, "/run/containerd/")):
        if run("umount", point, check=False).returncode != 0:
            run("umount", "-l", point, check=False)
    for name in pod_netns():
        run("ip", "netns", "delete", name, check=False)
    for link in data.get("links", []):
        run("ip", "link", "delete", link, check=False)
    rule = data.get("forward_rule")
    if rule:
        while run("iptables", "-w", "-D", "FORWARD", *rule, check=False).returncode == 0:
            pass
    proxy = cache_bin() / "kube-proxy"
    if proxy.is_file():
        run(str(proxy), "--cleanup", check=False)
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) or Path("/usr/sbin", tool).exists():
            _remove_chains(tool)
    for root in list(_cgroup_roots()):
        for group in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                group.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()
    for name, value in data.get("sysctls", {}).items():
        if read_sysctl(name) != value:
            with contextlib.suppress(OSError):
                sysctl_path(name).write_text(value)
    for path in data.get("created_paths", []):
        if Path(path).is_dir():
            shutil.rmtree(path, ignore_errors=True)
    # iptables-nft makes the tables it is asked about; those the node's start made, left empty, go
    before = data.get("nft_tables")
    if before is not None:
        for family, table in set(nft_tables() or []) - {tuple(t) for t in before}:
            if nft_table_is_empty(family, table):
                run("nft", "delete", "table", family, table, check=False)
    if work is not None:
        shutil.rmtree(work, ignore_errors=True)
    journal.remove()


def leftovers(journal_data: dict[str, Any]) -> list[str]:
    """Host changes of the node still present (empty after a complete ``restore``)."""
    found = []
    for tool in ("iptables", "ip6tables"):
        for table, chains in _iptables_chains(tool).items():
            found.append(f"{tool} -t {table}: {', '.join(chains)}")
    rule = journal_data.get("forward_rule")
    if rule and run("iptables", "-w", "-C", "FORWARD", *rule, check=False).returncode == 0:
        found.append(f"iptables FORWARD {' '.join(rule)}")
    for link in journal_data.get("links", []):
        if run("ip", "link", "show", link, check=False).returncode == 0:
            found.append(f"link {link}")
    work = journal_data.get("dir")
    prefixes = (f"{work}/",) if work else ()
    found += [f"mount {p}" for p in _mounts_under(prefixes)] if prefixes else []
    found += [f"network namespace {n}" for n in pod_netns()]
    found += [f"cgroup {p}" for p in _cgroup_roots()]
    for name, value in journal_data.get("sysctls", {}).items():
        if read_sysctl(name) != value:
            found.append(f"sysctl {name} = {read_sysctl(name)} (was {value})")
    if work and Path(work).exists():
        found.append(f"directory {work}")
    found += [f"path {p}" for p in journal_data.get("created_paths", []) if Path(p).exists()]
    before = journal_data.get("nft_tables")
    if before is not None:
        found += [f"nft table {f} {t}" for f, t in set(nft_tables() or []) - {tuple(t) for t in before}]
    return found


class NodePostgres(LocalPostgres):
    """A Postgres that pods reach too: it listens on the node's address, and trusts the pod network."""

    def init(self) -> None:
        super().init()
        with (self.datadir / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all 10.244.0.0/16 trust\nhost all all {NODE_IP}/32 trust\n")

    def server_options(self) -> list[str]:
        return [*super().server_options(), f"-c listen_addresses=127.0.0.1,{NODE_IP}"]

    def pod_dsn(self, database: str) -> str:
        return f"postgresql://postgres@{NODE_IP}:{self.port}/{database}"


def main(argv: list[str]) -> int:
    """``up``: start a node and wait (Ctrl-C stops it); ``down``: undo what a dead run left."""
    command = argv[1] if len(argv) > 1 else ""
    if command == "down":
        journal = Journal.load()
        if journal is None:
            print("no journal: nothing to undo")
            return 0
        data = dict(journal.data)
        restore(journal)
        left = leftovers(data)
        print("restored" if not left else "still present:\n  " + "\n  ".join(left))
        return 1 if left else 0
    if command == "up":
        node = NodeCluster()
        node.start()
        print(f"node Ready: KUBECONFIG={node.kubeconfig} ({node.timings}); Ctrl-C stops it", flush=True)
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            signal.sigwait({signal.SIGINT, signal.SIGTERM})
        finally:
            data = dict(node.journal.data)
            node.stop()
            left = leftovers(data)
            print("stopped" if not left else "still present:\n  " + "\n  ".join(left))
        return 0
    print(__doc__.split("\n\n")[0], "\nusage: python -m tests.node up|down", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
