-- Argo CD health check for kafkacleaner.io/CompactionPolicy.
--
-- Install it as resource.customizations.health.kafkacleaner.io_CompactionPolicy in argocd-cm
-- (gitops/README.md). Argo CD runs such a script on gopher-lua (Lua 5.1) with only the base,
-- table and a "safe" os library: no string or math library, no string methods. So this script
-- uses nothing else, and formats numbers only by concatenation (integral numbers print without
-- a fraction in gopher-lua and in the Lua 5.4 the tests use).
--
-- Rules, first match wins:
--   Suspended    spec.paused is true
--   Progressing  status.observedGeneration is missing or behind metadata.generation
--   Degraded     condition Stalled=True (the operator gave up on this generation)
--   Progressing  condition Reconciling=True (the operator is still working on it; a Ready=False
--                meanwhile is expected, as kstatus and Flux also read it)
--   Suspended    condition Ready=False with reason AwaitingManualRollout (rollout.strategy Manual
--                or OnDelete: pods wait for a roll a person or the Kafka operator makes)
--   Degraded     condition Ready=False, or Degraded=True
--   Progressing  Ready=True but observed at an older generation than metadata.generation
--   Healthy      Ready=True at the current generation
--   Progressing  otherwise, saying what is awaited
-- A Degraded or Healthy message is the deciding condition's message (its reason if empty).

local hs = {}

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function is(c, value)
  return c ~= nil and c.status == value
end

local function describe(c, fallback)
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c.reason ~= nil and c.reason ~= "" then
    return c.reason
  end
  return fallback
end

if obj.spec ~= nil and obj.spec.paused == true then
  hs.status = "Suspended"
  hs.message = "Reconciliation is paused (spec.paused)"
  return hs
end

local generation = obj.metadata.generation
local status = obj.status or {}
local conditions = status.conditions or {}

if status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the policy"
  if generation ~= nil then
    hs.message = "Waiting for the operator to observe generation " .. generation
  end
  return hs
end
if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. generation
    .. " (observed " .. status.observedGeneration .. ")"
  return hs
end

local ready = condition(conditions, "Ready")
local stalled = condition(conditions, "Stalled")
local reconciling = condition(conditions, "Reconciling")
local degraded = condition(conditions, "Degraded")

if is(stalled, "True") then
  hs.status = "Degraded"
  hs.message = describe(stalled, "Stalled")
  return hs
end
if is(reconciling, "True") then
  hs.status = "Progressing"
  hs.message = describe(reconciling, "Reconciling")
  return hs
end
if is(ready, "False") and ready.reason == "AwaitingManualRollout" then
  hs.status = "Suspended"
  hs.message = describe(ready, "Waiting for a manual rollout")
  return hs
end
if is(ready, "False") then
  hs.status = "Degraded"
  hs.message = describe(ready, "Not ready")
  return hs
end
if is(degraded, "True") then
  hs.status = "Degraded"
  hs.message = describe(degraded, "Degraded")
  return hs
end
if is(ready, "True") then
  if generation ~= nil and ready.observedGeneration ~= nil and ready.observedGeneration < generation then
    hs.status = "Progressing"
    hs.message = "Ready condition is from generation " .. ready.observedGeneration
      .. "; waiting for generation " .. generation
    return hs
  end
  hs.status = "Healthy"
  hs.message = describe(ready, "Ready")
  return hs
end

hs.status = "Progressing"
if ready == nil then
  hs.message = "Waiting for the Ready condition"
else
  hs.message = describe(ready, "Ready is " .. tostring(ready.status))
end
return hs
