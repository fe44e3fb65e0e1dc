// redislock::reply: the value type adapters convert their client's replies into.
#include <gtest/gtest.h>

#include <redislock/reply.hpp>

namespace {

using redislock::reply;

TEST(Reply, ErrorCodeIsTheFirstWord) {
    EXPECT_TRUE(reply::error("NOSCRIPT No matching script.").is_error_code("NOSCRIPT"));
    EXPECT_TRUE(reply::error("WRONGTYPE").is_error_code("WRONGTYPE"));
    EXPECT_FALSE(reply::error("NOSCRIPTS x").is_error_code("NOSCRIPT"));
    EXPECT_FALSE(reply::error("ERR unknown command").is_error_code("NOSCRIPT"));
    EXPECT_FALSE(reply::string("NOSCRIPT").is_error_code("NOSCRIPT"));
}

// Redis before 7.0 wraps an error raised by redis.call() inside a script in its own ERR.
TEST(Reply, ErrorCodeRaisedInsideAScriptOnOlderServersIsRecognised) {
    const reply wrapped = reply::error(
        "ERR Error running script (call to f_0123456789abcdef0123456789abcdef01234567): "
        "@user_script:6: WRONGTYPE Operation against a key holding the wrong kind of value");
    EXPECT_TRUE(wrapped.is_error_code("WRONGTYPE"));
    EXPECT_FALSE(wrapped.is_error_code("NOSCRIPT"));
    EXPECT_FALSE(reply::error("ERR the value WRONGTYPE is odd").is_error_code("WRONGTYPE"));
}

TEST(Reply, AccessorsReturnNeutralValuesForOtherKinds) {
    const reply n = reply::nil();
    EXPECT_TRUE(n.is_nil());
    EXPECT_EQ(n.as_integer(), 0);
    EXPECT_TRUE(n.text().empty());
    EXPECT_TRUE(n.elements().empty());
    const reply a = reply::array({reply::integer(7), reply::status("OK")});
    ASSERT_EQ(a.elements().size(), 2U);
    EXPECT_EQ(a.elements()[0].as_integer(), 7);
    EXPECT_EQ(a.elements()[1].text(), "OK");
    EXPECT_THROW(reply::error("ERR x").throw_if_error(), redislock::server_error);
    EXPECT_NO_THROW(reply::integer(1).throw_if_error());
}

}  // namespace
