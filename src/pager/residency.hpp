// SPDX-License-Identifier: Apache-2.0
// What of one model is in its region, what is read next, and what goes out:
// the units' states (FillPlan), the status page clients read them from, and
// for a streamed model (bigger than its budget of pool pages) the budget,
// the residency policy (StreamPolicy) and the units being dropped. Pure
// bookkeeping over memory the pager owns (the status page); the pager does
// the I/O (reads, punches, messages to clients).
//
// A unit's life: EMPTY → IN_FLIGHT (read issued) → READY (bytes complete,
// its status bit set) → for a streamed model, back to EMPTY when it is
// dropped: first its status bit is cleared and every cooperative client is
// asked to close it (CLOSING: still in the region, a touch takes it back),
// then, once none can read it any more, its page is punched. FAILED (a read
// error) is final: every touch gets SIGBUS.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "pager/access_order.hpp"
#include "pager/client_service.hpp"
#include "pager/fill_plan.hpp"
#include "pager/stream_policy.hpp"
#include "wire/status_page.hpp"

namespace airs::pager {

// Per streamed model: what it streams, for status.
struct StreamStats {
  uint64_t budget_units = 0;
  uint32_t window = 0;
  uint32_t cyclic_units = 0;   // units a token reads in full, once each
  uint64_t passes = 0;         // tokens (cycles) the clients completed
  uint64_t units_read = 0;     // since load
  uint64_t last_pass_units_read = 0;
  uint64_t units_dropped = 0;
  uint64_t drops_refused = 0;  // cooperative clients that did not close a unit in time
  uint32_t closing = 0;        // units being dropped now
  // A mixture of experts: expert uses the cache counted (hinted and
  // touched), and units read because a hint named their expert.
  uint64_t expert_uses = 0;
  uint32_t expert_keys = 0;       // experts in the model (0: dense)
  uint64_t resident_touches = 0;  // touches of units that were in (faults, cooperative opens)
  uint64_t hinted_units_read = 0;
  // Units read because a prediction named their expert (a guess: the
  // reads a wrong one costs are here too).
  uint64_t predicted_units_read = 0;
};

class Residency {
 public:
  // `plan`: the model's units with their load ranks; `status`: its status
  // page (initialised here); `steps`: for a streamed model, each unit's
  // step in the per-token cycle (StreamPolicy), with `budget` units and a
  // read-ahead `window` and its expert slices (`experts`, empty for a
  // dense model); empty for a model that fits.
  Residency(FillPlan plan, wire::StatusPageWriter status, uint64_t unit_size, uint64_t file_size,
            UnitSteps steps, uint32_t budget, uint32_t window, ExpertLayout experts = {});

  [[nodiscard]] FillPlan& plan() { return plan_; }
  [[nodiscard]] const FillPlan& plan() const { return plan_; }
  [[nodiscard]] wire::StatusPageWriter& status() { return status_; }
  [[nodiscard]] wire::ModelLoadState state() const { return state_; }
  void set_state(wire::ModelLoadState s);
  [[nodiscard]] uint32_t units() const { return plan_.unit_count(); }

  // --- reads ---
  void read_started(uint32_t u);
  // The unit's bytes are complete: READY, its status bit set (publish()
  // makes it visible), queued for mapping (take_newly_ready).
  void read_done(uint32_t u);
  void read_failed(uint32_t u);
  [[nodiscard]] std::vector<uint32_t> take_newly_ready();
  // Bumps the status page's generation; the caller futex-wakes it.
  void publish() { status_.publish(); }
  // Every unit READY (a model that fits): RESIDENT now, once.
  [[nodiscard]] bool became_resident();
  // A model adopted filled: every unit READY at once.
  void all_ready();

  // --- streamed models ---
  [[nodiscard]] bool streamed() const { return policy_.has_value(); }
  [[nodiscard]] StreamPolicy& policy() { return *policy_; }
  [[nodiscard]] const StreamPolicy& policy() const { return *policy_; }
  [[nodiscard]] uint32_t budget() const { return budget_; }
  void set_budget(uint32_t units) { budget_ = units; }
  // Units holding a page: in flight, ready, closing.
  [[nodiscard]] uint32_t held() const { return plan_.ready() + plan_.in_flight(); }
  [[nodiscard]] bool closing(uint32_t u) const { return closing_.contains(u); }
  // Units a drop may start on: READY, not closing, not `busy(u)`.
  [[nodiscard]] std::vector<uint32_t> droppable(const std::function<bool(uint32_t)>& busy) const;
  // A client touched `u` (the policy follows it; a new token counts a pass).
  void touched(ClientKey client, uint32_t u);
  // A client used expert `key` (ExpertLayout). For a mixture of experts a
  // pass is counted here, when a client's expert layer goes back: its
  // dense units stay resident and mapped, so they give no signal. Only
  // misses are seen: a token without one joins the next one's pass.
  // `current`, `count`: StreamPolicy::touched_expert.
  void touched_expert(ClientKey client, uint32_t key, bool current = true, bool count = true);
  // A client's expert hint (StreamPolicy::hinted). Passes are not counted
  // here: a lazy client hints on a socket of its own (another key than its
  // faults'), and its touches count them.
  void hinted(ClientKey client, std::span<const uint32_t> keys);
  // A read was issued for `u` because of a hint.
  void hinted_read() { ++stats_.hinted_units_read; }
  // A client touched a unit that was in.
  void touched_in() { ++stats_.resident_touches; }
  // A read was issued for `u` because of a prediction.
  void predicted_read() { ++stats_.predicted_units_read; }
  // The client is gone.
  void forget(ClientKey client);
  // The drop of READY unit `u` starts: its status bit is cleared (publish).
  void begin_drop(uint32_t u);
  // A touch wants `u` back before its page went: READY again.
  void cancel_drop(uint32_t u);
  // Nobody can read `u` any more and its page was punched: EMPTY.
  void dropped(uint32_t u);
  // A cooperative client did not close `u` in time: READY again, counted.
  void drop_refused(uint32_t u);
  [[nodiscard]] const std::set<uint32_t>& closing_units() const { return closing_; }
  [[nodiscard]] StreamStats stream_stats() const;

  // --- the recorded access order ---
  std::optional<AccessRecorder>& recorder() { return recorder_; }
  [[nodiscard]] const std::vector<uint32_t>& read_order() const { return read_order_; }

 private:
  void new_pass();
  FillPlan plan_;
  wire::StatusPageWriter status_;
  wire::ModelLoadState state_ = wire::ModelLoadState::Loading;
  std::vector<uint32_t> newly_ready_;
  std::vector<uint32_t> read_order_;
  std::optional<AccessRecorder> recorder_;
  std::optional<StreamPolicy> policy_;
  uint32_t budget_ = 0;
  std::set<uint32_t> closing_;
  std::optional<uint32_t> last_step_;  // the farthest step any client reached in this pass
  std::map<ClientKey, uint32_t> expert_layer_;  // per client: the layer of its last expert
  StreamStats stats_;
  uint64_t pass_start_reads_ = 0;
};

}  // namespace airs::pager
