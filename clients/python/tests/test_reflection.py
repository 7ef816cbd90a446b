"""gRPC reflection in the version Python's grpcio-reflection speaks (v1alpha): its client lists
`turnstile.v1.Agent` and resolves the API's messages, with no proto files, on `turnstile dev`."""

from __future__ import annotations

import unittest

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from harness import DevServer


class ReflectionV1Alpha(unittest.TestCase):
    def setUp(self) -> None:
        self.dev = DevServer()

    def tearDown(self) -> None:
        self.dev.close()

    def test_grpcio_reflection_lists_the_agent_service_and_resolves_its_messages(self):
        with grpc.insecure_channel(self.dev.address) as channel:
            database = ProtoReflectionDescriptorDatabase(channel)
            services = set(database.get_services())
            self.assertIn("turnstile.v1.Agent", services)
            self.assertNotIn("turnstile.cluster.v1.Worker", services, "the internal API is not advertised")
            self.assertIn("grpc.reflection.v1alpha.ServerReflection", services)
            self.assertIn("grpc.reflection.v1.ServerReflection", services)
            agent = database.FindFileContainingSymbol("turnstile.v1.Agent")
            self.assertEqual(agent.package, "turnstile.v1")
            methods = {m.name for s in agent.service if s.name == "Agent" for m in s.method}
            self.assertTrue({"Followup", "Watch", "ServeTools"} <= methods, methods)
            events = database.FindFileContainingSymbol("turnstile.v1.SessionEvent")
            self.assertEqual(events.name, "turnstile/v1/events.proto")


if __name__ == "__main__":
    unittest.main()
