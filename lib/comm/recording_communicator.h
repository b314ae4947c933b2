#pragma once
// Wraps a communicator so that the flight recorder (comm/flight_recorder.h) sees every collective:
// it is recorded when it starts and when its wait returns; a wait that fails (a timeout, a peer
// gone) throws CommError with the recorder's diagnosis appended.
#include <memory>

#include "comm/communicator.h"
#include "comm/flight_recorder.h"

namespace trainer::comm {

std::unique_ptr<Communicator> record_collectives(std::unique_ptr<Communicator> inner,
                                                 std::shared_ptr<FlightRecorder> recorder);

}  // namespace trainer::comm
