// The start-up check that every rank of a job has the same settings where they must match
// (MustMatch in common/options.h): one digest per rank gathered at rank 0, and only when the
// digests differ a second round with every rank's list, so that the error names each setting that
// differs, its values and the ranks that hold each.
#pragma once

#include <vector>

#include "engine/collectives/collectives.h"
#include "engine/common/options.h"

namespace kolo::collectives {

// Collective over `comm`: OK on every rank when every rank passed the same `settings` (same names,
// values and order), else InvalidArgument on every rank, e.g. "ranks disagree on settings that
// must match: num_batches is 40 on ranks 0-1,3 and 3 on rank 2". Two message rounds (a gather and
// a broadcast of 32 bytes per rank) when they match, four when they do not.
Status CheckSettingsMatch(Comm& comm, const std::vector<MatchedSetting>& settings);

// Rank 0's verdict given every rank's list: empty when all equal, else the error text above.
std::string DescribeSettingMismatch(const std::vector<std::vector<MatchedSetting>>& per_rank);

}  // namespace kolo::collectives
