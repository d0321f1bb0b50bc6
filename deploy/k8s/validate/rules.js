// The project's rules for deploy/k8s (deploy/k8s/README.md says why each
// holds): what a schema cannot know.
"use strict";

const kAllowedCapabilities = new Set(["IPC_LOCK"]);
const kDaemonHostPaths = new Set(["/run/mooncake", "/run/nvidia/validations"]);

function podSpecOf(doc) {
  if (doc.kind === "Pod") return doc.spec;
  if (doc.spec && doc.spec.template) return doc.spec.template.spec;
  return null;
}

function allContainers(spec) {
  return [...(spec.initContainers || []), ...(spec.containers || [])];
}

function checkContainer(c, where, errors, { daemon }) {
  const sc = c.securityContext || {};
  if (sc.privileged === true) errors.push(`${where}: privileged`);
  if (sc.allowPrivilegeEscalation !== false) {
    errors.push(`${where}: allowPrivilegeEscalation must be false`);
  }
  const caps = sc.capabilities || {};
  if (!(caps.drop || []).includes("ALL")) errors.push(`${where}: capabilities.drop must hold ALL`);
  for (const cap of caps.add || []) {
    if (!daemon || !kAllowedCapabilities.has(cap)) errors.push(`${where}: capability ${cap} added`);
  }
  const res = c.resources || {};
  if (!res.requests || !res.requests.cpu || !res.requests.memory) {
    errors.push(`${where}: resources.requests.cpu and .memory must be set`);
  }
  if (!res.limits || !res.limits.memory) errors.push(`${where}: resources.limits.memory must be set`);
}

function checkDaemonSet(doc, label, errors) {
  const spec = podSpecOf(doc);
  if (!spec) return errors.push(`${label}: no pod template`);
  if (spec.hostPID || spec.hostIPC) errors.push(`${label}: hostPID/hostIPC`);
  const selector = spec.nodeSelector || {};
  const affinity = JSON.stringify(spec.affinity || {});
  if (selector["nvidia.com/gpu.present"] !== "true" && !affinity.includes("nvidia.com/gpu.present")) {
    errors.push(`${label}: must select nodes with nvidia.com/gpu.present`);
  }
  const init = spec.initContainers || [];
  if (!init.some((c) => JSON.stringify(c.command || []).includes("/run/nvidia/validations/driver-ready"))) {
    errors.push(`${label}: an initContainer must wait for the GPU operator's driver-ready marker`);
  }
  for (const c of allContainers(spec)) checkContainer(c, `${label} ${c.name}`, errors, { daemon: true });
  const main = (spec.containers || []).find((c) => c.name === "mooncaked");
  if (!main) return errors.push(`${label}: no container named mooncaked`);
  const probe = main.readinessProbe && main.readinessProbe.exec && main.readinessProbe.exec.command;
  if (!probe || !/mcctl$/.test(probe[0]) || !probe.includes("status")) {
    errors.push(`${label}: readinessProbe must exec mcctl ... status`);
  }
  const mounts = new Map((main.volumeMounts || []).map((m) => [m.name, m.mountPath]));
  for (const v of spec.volumes || []) {
    if (!v.hostPath) continue;
    if (!kDaemonHostPaths.has(v.hostPath.path)) errors.push(`${label}: hostPath ${v.hostPath.path}`);
    if (v.hostPath.path === "/run/mooncake" && mounts.get(v.name) !== "/run/mooncake") {
      errors.push(`${label}: /run/mooncake must be mounted at /run/mooncake`);
    }
  }
  if (!(spec.volumes || []).some((v) => v.hostPath && v.hostPath.path === "/run/mooncake")) {
    errors.push(`${label}: the socket directory /run/mooncake must be a hostPath`);
  }
}

// A pod (or pod template) outside the daemon's namespace: a tenant's job.
function checkTenantPod(doc, label, errors) {
  const spec = podSpecOf(doc);
  const ns = (doc.metadata && doc.metadata.namespace) || "";
  for (const c of allContainers(spec)) checkContainer(c, `${label} ${c.name}`, errors, { daemon: false });
  for (const v of spec.volumes || []) {
    if (v.hostPath && v.hostPath.path !== `/run/mooncake/tenants/${ns}`) {
      errors.push(`${label}: hostPath ${v.hostPath.path} (a tenant pod mounts only /run/mooncake/tenants/${ns})`);
    }
  }
}

function checkRules(docs) {
  const errors = [];
  const configs = new Map();
  for (const { doc } of docs) {
    if (doc.kind === "ConfigMap" && doc.data && doc.data["mooncaked.conf"]) {
      configs.set(doc.metadata.name, doc.data["mooncaked.conf"]);
    }
  }
  const tenants = new Set();
  for (const text of configs.values()) {
    const m = text.match(/^\s*tenant_sockets\s*=\s*(.*)$/m);
    if (m) for (const t of m[1].split(",")) if (t.trim()) tenants.add(t.trim().split(":")[0]);
  }
  for (const { label, doc } of docs) {
    if (doc.kind === "DaemonSet") {
      checkDaemonSet(doc, label, errors);
      for (const v of podSpecOf(doc).volumes || []) {
        if (v.configMap && !configs.has(v.configMap.name)) {
          errors.push(`${label}: ConfigMap ${v.configMap.name} is not among the manifests`);
        }
      }
    } else if (podSpecOf(doc)) {
      checkTenantPod(doc, label, errors);
      const ns = doc.metadata && doc.metadata.namespace;
      if (tenants.size > 0 && !tenants.has(ns)) {
        errors.push(`${label}: namespace ${ns} is not in tenant_sockets (${[...tenants].join(",")})`);
      }
    } else if (doc.kind === "Namespace" && doc.metadata.labels &&
               doc.metadata.labels["mooncake.io/tenant"] === "true" && tenants.size > 0 &&
               !tenants.has(doc.metadata.name)) {
      errors.push(`${label}: tenant namespace not in tenant_sockets`);
    }
  }
  return errors;
}

module.exports = { checkRules };
