// Reads a JSON list of Kubernetes objects on stdin; writes {index: problem} for those that
// do not validate against their CustomResourceDefinition's OpenAPI schema (as packaged by
// kubernetes-models; CEL rules are not checked), or whose kind it does not know.
import { HTTPRoute } from "@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { readFileSync } from "node:fs";

const MODELS = {
  "gateway.networking.k8s.io/v1 HTTPRoute": HTTPRoute,
  "monitoring.coreos.com/v1 PrometheusRule": PrometheusRule,
  "monitoring.coreos.com/v1 ServiceMonitor": ServiceMonitor,
};
const objects = JSON.parse(readFileSync(0, "utf8"));
const problems = {};
objects.forEach((object, index) => {
  const Model = MODELS[`${object.apiVersion} ${object.kind}`];
  if (!Model) {
    problems[index] = `no schema for ${object.apiVersion} ${object.kind}`;
    return;
  }
  try {
    new Model(object).validate();
  } catch (error) {
    problems[index] = error.message;
  }
});
process.stdout.write(JSON.stringify(problems));
