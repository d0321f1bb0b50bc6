#!/usr/bin/env node
// Validates Kubernetes manifests (deploy/k8s/*.yaml) offline:
//   1. schema: every document against the Kubernetes OpenAPI schema of its
//      apiVersion/kind, with the validators kubernetes-models ships
//      (generated from Kubernetes' OpenAPI spec; types, required fields,
//      enums, formats such as quantities);
//   2. strict: no field the API does not define (a misspelt
//      "readinesProbe" would otherwise pass, since the OpenAPI schemas allow
//      unknown fields), read from the same package's type declarations;
//   3. the project's rules for mooncaked's DaemonSet and the tenant pods
//      (rules.js).
// Usage: node validate.js FILE.yaml... ; exit 0 when all pass, 1 otherwise.
// Needs `npm ci` here first (deploy/install-deps.sh does it).
"use strict";

const fs = require("fs");
const path = require("path");
const yaml = require("js-yaml");
const { checkRules } = require("./rules.js");

const modelsRoot = path.dirname(require.resolve("kubernetes-models/package.json"));
const apimachineryRoot = path.dirname(
  require.resolve("@kubernetes-models/apimachinery/package.json"));

function modelFile(apiVersion, kind) {
  if (!/^[A-Za-z0-9.\-/]+$/.test(apiVersion) || !/^[A-Za-z0-9]+$/.test(kind)) return null;
  const base = path.join(modelsRoot, apiVersion, kind);
  return fs.existsSync(base + ".js") ? base : null;
}

// ---- strict fields from the .d.ts declarations ----
const interfaces = new Map();  // "file.d.ts" -> {props: Map(name -> type text), imports}

function resolveImport(fromFile, spec) {
  if (spec.startsWith(".")) return path.resolve(path.dirname(fromFile), spec) + ".d.ts";
  const m = spec.match(/^@kubernetes-models\/apimachinery\/(.*)$/);
  if (m) return path.join(apimachineryRoot, m[1]) + ".d.ts";
  return null;
}

function loadInterface(file) {
  if (interfaces.has(file)) return interfaces.get(file);
  let entry = null;
  if (fs.existsSync(file)) {
    const text = fs.readFileSync(file, "utf8");
    const imports = new Map();
    for (const m of text.matchAll(/^import \{ (\w+) \} from "([^"]+)";$/gm)) {
      imports.set(m[1], resolveImport(file, m[2]));
    }
    const body = text.match(/^export interface I\w+( extends TypeMeta)? \{\n([\s\S]*?)^\}$/m);
    if (body) {
      const props = new Map();
      if (body[1]) {  // TypeMeta: apiVersion and kind
        props.set("apiVersion", "string");
        props.set("kind", "string");
      }
      const lines = body[2].split("\n");
      for (let i = 0; i < lines.length; ++i) {
        const p = lines[i].match(/^ {4}"([^"]+)"\??: (.*)$/);
        if (!p) continue;
        let type = p[2];
        if (type === "{") {  // a map: { [key: string]: T; }
          const v = (lines[i + 1] || "").match(/\[key: string\]: (.*);$/);
          type = v ? "Map<" + v[1] + ">" : "any";
        } else {
          type = type.replace(/;$/, "");
        }
        props.set(p[1], type);
      }
      entry = { props, imports };
    }
  }
  interfaces.set(file, entry);
  return entry;
}

// The interface file a type text refers to, and whether it is an array or map of it.
function elementType(type) {
  let t = type.trim();
  let wrap = "";
  let m;
  if ((m = t.match(/^Array<(.*)>$/))) { wrap = "array"; t = m[1].trim(); }
  else if ((m = t.match(/^Map<(.*)>$/))) { wrap = "map"; t = m[1].trim(); }
  return { wrap, name: /^I\w+$/.test(t) ? t : null };
}

function checkStrict(value, file, where, errors) {
  const iface = loadInterface(file);
  if (!iface || value === null || typeof value !== "object" || Array.isArray(value)) return;
  for (const [key, v] of Object.entries(value)) {
    if (!iface.props.has(key)) {
      errors.push(`${where}/${key}: no such field (known: ${[...iface.props.keys()].join(", ")})`);
      continue;
    }
    const { wrap, name } = elementType(iface.props.get(key));
    if (!name) continue;
    const target = iface.imports.get(name);
    if (!target) continue;
    if (wrap === "array" && Array.isArray(v)) {
      v.forEach((item, i) => checkStrict(item, target, `${where}/${key}/${i}`, errors));
    } else if (wrap === "map" && v && typeof v === "object") {
      for (const [k, item] of Object.entries(v)) checkStrict(item, target, `${where}/${key}/${k}`, errors);
    } else if (wrap === "") {
      checkStrict(v, target, `${where}/${key}`, errors);
    }
  }
}

function validateDocument(doc, label) {
  const errors = [];
  if (!doc || typeof doc !== "object") return [`${label}: not a Kubernetes object`];
  const base = modelFile(String(doc.apiVersion), String(doc.kind));
  if (!base) return [`${label}: unknown apiVersion/kind ${doc.apiVersion}/${doc.kind}`];
  const mod = require(base + ".js");
  const Model = mod[doc.kind];
  try {
    new Model(doc).validate();
  } catch (e) {
    errors.push(`${label}: schema: ${e.message}`);
  }
  checkStrict(doc, base + ".d.ts", label, errors);
  return errors;
}

function main(files) {
  if (files.length === 0) {
    console.error("usage: validate.js FILE.yaml...");
    return 2;
  }
  const docs = [];
  let failures = 0;
  let count = 0;
  for (const file of files) {
    let loaded;
    try {
      loaded = yaml.loadAll(fs.readFileSync(file, "utf8"));
    } catch (e) {
      console.log(`FAIL ${file}: ${e.message}`);
      ++failures;
      continue;
    }
    loaded.forEach((doc, i) => {
      if (doc === null || doc === undefined) return;
      const label = `${path.basename(file)}#${i} ${doc.kind}/${doc.metadata && doc.metadata.name}`;
      const errors = validateDocument(doc, label);
      ++count;
      docs.push({ file, label, doc });
      if (errors.length) {
        ++failures;
        for (const e of errors) console.log(`FAIL ${e}`);
      } else {
        console.log(`ok   ${label}`);
      }
    });
  }
  for (const e of checkRules(docs)) {
    ++failures;
    console.log(`FAIL rule: ${e}`);
  }
  console.log(`${count} documents, ${failures} failure(s)`);
  return failures === 0 ? 0 : 1;
}

if (require.main === module) process.exit(main(process.argv.slice(2)));
module.exports = { validateDocument };
